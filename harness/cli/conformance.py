"""``harness conformance``: the EPP-agnostic scenarios against any EPP command line, as one table.

It runs the scenarios the harness ships (`harness.scenarios.conformance`, collected with
``pytest --pyargs``, so an installed wheel needs no checkout of this repository), restricted to the
tests marked ``epp_agnostic``, with ``--epp-command`` (`harness.plugin.conformance`), reads back the
per-test records the plugin writes (``--conformance-json``) and prints, per scenario, one of:

* ``pass``;
* ``differs by design: <departure>`` — the test checks one of our deliberate departures from
  upstream (``@pytest.mark.departure``) and this EPP behaves otherwise;
* ``upstream bug: <name>`` — the test checks behaviour a known upstream bug breaks
  (``@pytest.mark.upstream_bug``) and this EPP shows it;
* ``not applicable: <capability>`` — the test needs a capability (``@pytest.mark.needs``) this EPP
  lacks (its flag profile says so, e.g. v1.6.0's round-robin lwepp, or ``--epp-lacks``): not run;
  ``not applicable: API generation <name>`` — the test is about the other generation's objects
  (``@pytest.mark.api_generation``, e.g. ``targetPorts``, which only an InferencePool v1 has);
* ``FAIL`` — anything else; its evidence follows the table (what was sent through Envoy, what came
  back, which pod got each request, and what the traffic oracle saw).

For a CI job page: ``--junit-xml PATH`` keeps pytest's JUnit report, ``--summary-md PATH`` writes the
table as Markdown (append it to ``$GITHUB_STEP_SUMMARY``).

The inner pytest runs in a scratch directory with an ini file of its own, so the settings of the
directory it is started from (an EPP repository's own pytest configuration) never reach it.

Exit 0 when no scenario is ``FAIL`` (differences by design and known upstream bugs are expected),
1 otherwise, or pytest's own exit code when the run itself broke (2-5).

Parallelism: ``-n 2`` by default. An EPP that always binds a fixed port (upstream v0.3.0's
controller-runtime metrics server binds ``:8080`` on every address) runs one instance at a time per
host whatever ``-n`` says: the Stacks take turns on that port (`harness.base.ports.claim_port`), the
rest of each scenario (pods, Envoy, requests) still overlaps. A private loopback address per
instance cannot help there (``:8080`` is a wildcard bind), and a private network namespace would cut
the EPP off from the API server and the simulators on the host's loopback.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from harness.cli.console import Column, console, table
from harness.cluster import go_binaries, releases
from harness.subject import flag_profiles
from harness.subject.foreign_epp import EppCommand
from harness.verdicts import departures

HELP = "run the EPP-agnostic scenarios against any EPP command line and print a conformance table"
SCENARIOS: Final = "harness.scenarios.conformance"
WHAT_HAPPENED_CHARS: Final = 150
GENERATION_SKIP: Final = "written for API generation "
# The inner run's whole configuration: the markers the scenarios use and the per-test timeout.
INNER_INI: Final = """[pytest]
timeout = 300
markers =
    e2e: needs the control plane, Envoy and the EPP process
    integration: needs the hermetic control plane
"""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--epp-command",
        metavar="CMD",
        help="the EPP to test: a command line taking upstream's flag names (quoted), or 'ours'",
    )
    which.add_argument(
        "--upstream",
        metavar="VERSION",
        nargs="?",
        const=f"v{go_binaries.UPSTREAM_EPP_VERSION}",
        help=f"upstream's Go EPP (default v{go_binaries.UPSTREAM_EPP_VERSION}), as built by "
        "`harness build --upstream-epp VERSION`",
    )
    parser.add_argument(
        "--epp-fixed-ports",
        metavar="PORTS",
        help="comma list of ports --epp-command binds whatever its flags say (default 8080; '' for none)",
    )
    parser.add_argument(
        "--epp-flags",
        metavar="PROFILE",
        choices=sorted(flag_profiles.PROFILES),
        help="the EPP's flag dialect: v0.3 (camelCase), v1 (kebab-case), lwepp (default: from its --help)",
    )
    parser.add_argument(
        "--epp-lacks",
        metavar="CAPABILITIES",
        help="comma list of capabilities the EPP lacks, so scenarios that need them are 'not applicable' "
        f"({', '.join(departures.CAPABILITIES)}; default: its flag profile's, '' for none)",
    )
    parser.add_argument(
        "--crd-release",
        metavar="VERSION",
        help=f"the CRDs to install and the API generation to speak: {', '.join(releases.RELEASES)} "
        f"(default: ${releases.CRD_RELEASE_ENV}, else {releases.DEFAULT_CRD_RELEASE})",
    )
    parser.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    parser.add_argument("-k", dest="keyword", help="only scenarios matching this pytest -k expression")
    parser.add_argument("--json", type=Path, help="also keep the per-scenario records (JSON) here")
    parser.add_argument("--junit-xml", type=Path, metavar="PATH", help="also write pytest's JUnit XML report")
    parser.add_argument(
        "--summary-md", type=Path, metavar="PATH", help="also write the table as Markdown (a CI job summary)"
    )


def run(args: argparse.Namespace) -> int:
    if args.crd_release is not None:
        try:
            releases.check_release(args.crd_release)
        except releases.UnknownReleaseError as exc:
            print(f"harness conformance: {exc}", file=sys.stderr)
            return 2
    if args.upstream is not None:
        version = str(args.upstream).removeprefix("v")
        if go_binaries.find_upstream_epp(version) is None:
            print(
                f"harness conformance: upstream EPP v{version} is not built: run "
                f"`harness build --upstream-epp v{version}` (about 4 minutes)",
                file=sys.stderr,
            )
            return 2
        command = f"upstream:{version}"
    else:
        command = str(args.epp_command)
        try:  # a flag dialect that does not fit is one clear error here, not one FAIL per scenario
            EppCommand.from_text(command, args.epp_fixed_ports, args.epp_flags)
        except flag_profiles.FlagProfileError as exc:
            print(f"harness conformance: {exc}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="epp-conformance-") as scratch:
        records_path = (args.json or Path(scratch) / "conformance.json").resolve()
        ini = Path(scratch) / "pytest.ini"
        ini.write_text(INNER_INI)
        argv = [
            sys.executable, "-m", "pytest", "--pyargs", SCENARIOS, "-m", departures.EPP_AGNOSTIC,
            "-c", str(ini), "--rootdir", scratch, "-p", "no:randomly", "-p", "no:cacheprovider",
            "-q", "--no-header", "-rN", "--tb=no",
            f"--epp-command={command}", f"--conformance-json={records_path}",
            *([f"--junit-xml={args.junit_xml.resolve()}"] if args.junit_xml else []),
            *(["-n", str(args.workers)] if args.workers > 0 else []),
            *(["-k", args.keyword] if args.keyword else []),
            *([f"--epp-fixed-ports={args.epp_fixed_ports}"] if args.epp_fixed_ports is not None else []),
            *([f"--epp-flags={args.epp_flags}"] if args.epp_flags else []),
            *([f"--epp-lacks={args.epp_lacks}"] if args.epp_lacks is not None else []),
            *([f"--crd-release={args.crd_release}"] if args.crd_release else []),
        ]  # fmt: skip
        release = args.crd_release or releases.default_release()
        print(
            f"running the EPP-agnostic scenarios against {command!r} on the CRDs of {release} ...", flush=True
        )
        started = time.monotonic()
        returncode = subprocess.run(argv, cwd=scratch, check=False).returncode
        elapsed = time.monotonic() - started
        if returncode not in (0, 1) or not records_path.exists():
            print(f"harness conformance: pytest exited {returncode} without a complete run", file=sys.stderr)
            return returncode or 1
        document = json.loads(records_path.read_text())
    rows = [Row.from_record(record) for record in document["tests"]]
    title = f"{command} (CRDs {release})"
    render(title, rows)
    print(f"ran in {_duration(elapsed)}", flush=True)
    if args.summary_md:
        args.summary_md.write_text(markdown(title, rows))
    return 1 if any(row.result == "FAIL" for row in rows) else 0


@dataclass(frozen=True)
class Row:
    scenario: str
    result: str
    what_happened: str
    evidence: str

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Row:
        return cls(
            scenario_name(str(record["nodeid"])), classify(record), first_line(record), record["evidence"]
        )


def classify(record: Mapping[str, Any]) -> str:
    """pass / skipped / differs by design: <departure> / upstream bug: <name> / FAIL."""
    outcome = record["outcome"]
    if outcome == "passed":
        return "pass"
    if outcome == "skipped":
        missing = record.get("not_applicable") or []
        if missing:
            return f"not applicable: {', '.join(missing)}"
        # `@pytest.mark.api_generation` (harness.plugin.core): a scenario of the other generation's objects.
        message = str(record.get("message") or "")
        if GENERATION_SKIP in message:
            return f"not applicable: API generation {message.split(GENERATION_SKIP, 1)[1].split(',', 1)[0]}"
        return "skipped"
    if outcome != "failed" or record.get("stack_start_failed"):
        return "FAIL"  # an error setting up a scenario is never a behaviour difference
    if record.get("departure"):
        return f"differs by design: {record['departure']}"
    if record.get("upstream_bug"):
        return f"upstream bug: {record['upstream_bug']}"
    return "FAIL"


def scenario_name(nodeid: str) -> str:
    """``tests/e2e/test_x.py::test_y[p]`` -> ``test_x::test_y[p]``."""
    path, _, rest = nodeid.partition("::")
    return f"{Path(path).stem}::{rest}" if rest else Path(path).stem


def first_line(record: Mapping[str, Any]) -> str:
    if record["outcome"] == "passed":
        return ""
    text = " ".join(str(record.get("message") or "").split())
    return text if len(text) <= WHAT_HAPPENED_CHARS else text[: WHAT_HAPPENED_CHARS - 1] + "…"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _counts(rows: Sequence[Row]) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        key = row.result.split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {key}" for key, n in sorted(counts.items()))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or " "


def markdown(command: str, rows: Sequence[Row]) -> str:
    """The table as GitHub-flavoured Markdown, FAIL rows' evidence folded below it."""
    lines = [
        f"### EPP conformance: `{command}`",
        "",
        _counts(rows),
        "",
        "| scenario | result | what happened |",
        "|---|---|---|",
        *(f"| {_cell(r.scenario)} | {_cell(r.result)} | {_cell(r.what_happened)} |" for r in rows),
    ]
    for row in rows:
        if row.result == "FAIL":
            evidence = row.evidence or "(no Stack evidence: the failure happened outside one)"
            lines += ["", f"<details><summary>evidence: {row.scenario}</summary>", "", "```", evidence, "```"]
            lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def render(command: str, rows: Sequence[Row], out: TextIO | None = None) -> None:
    target = console(out)
    summary = _counts(rows)
    columns = [Column("scenario", "left"), Column("result", "left"), Column("what happened", "left")]
    target.print(
        table(
            f"EPP conformance: {command}",
            columns,
            [(row.scenario, row.result, row.what_happened) for row in rows],
            caption=summary,
        )
    )
    bugs = sorted(
        {row.result.removeprefix("upstream bug: ") for row in rows if row.result.startswith("upstream")}
    )
    if bugs:
        target.print(
            "known upstream bugs shown: " + "; ".join(f"{b} ({departures.UPSTREAM_BUGS[b]})" for b in bugs)
        )
    lacking = sorted(
        {
            name.strip()
            for row in rows
            if row.result.startswith("not applicable: ")
            for name in row.result.removeprefix("not applicable: ").split(",")
            if name.strip() in departures.CAPABILITIES
        }
    )
    if lacking:
        target.print(
            "capabilities this EPP lacks: "
            + "; ".join(f"{c} ({departures.CAPABILITIES.get(c, '?')})" for c in lacking)
        )
    for row in rows:
        if row.result == "FAIL":
            target.print(f"\n--- evidence: {row.scenario}", markup=False)
            target.print(row.what_happened, markup=False)
            target.print(
                row.evidence or "(no Stack evidence: the failure happened outside one)", markup=False
            )
