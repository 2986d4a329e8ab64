"""Mutation testing of the EPP: mutmut's kill rate per package of `epp/`, and the mutants that survived.

A mutant is a small realistic mistake (a flipped comparison, a constant off by one, a dropped call)
planted in one function; the tests that reach that function run against it, and a suite that stays
green has a gap. mutmut (configured in pyproject.toml, `[tool.mutmut]`: the unit tier is its runner)
copies the tree to `mutants/`, mutates it there and runs, for each mutant, only the tests that
reached the mutated function in a first stats run. Results are kept in `mutants/` between runs, so a
second run only checks what changed.

Not part of .ci/run (hours for the whole of epp/ on 2 cores): run it before resolving an issue that
changes `epp/`, a package at a time. mutmut comes from `requirements/mutation.txt` (hashes checked),
installed into .venv on first use. Prints, never asserts; the target (issue 24) is a kill rate of
at least 90% for each package, every survivor either killed by a new test or explained.

    .venv/bin/python benchmarks/mutation.py [PACKAGE ...] [--max-children 2] [--report-only] [--survivors]
        [--integration]
        PACKAGE: controller datastore k8s scheduling handlers h2 (default: those six)
    .venv/bin/mutmut show <mutant name>       # the diff of one survivor
    .venv/bin/python benchmarks/mutation.py --by-hand tests/unit/handlers NAME [NAME ...]

`--survivors` checks every survivor of the packages again through mutmut, after new tests were
written: mutmut first collects which functions the new tests reach, then runs each survivor's tests.
`--integration` runs no mutmut: after a run, it plants each behaviour-changing survivor in `epp/` by
hand and runs its package's fast subset of the integration tier against one control plane
(`mutation_integration.py`, beside this file, says which tests and why mutmut cannot run them
itself); the report counts what that subset kills, and remembers it in `mutants/` until the
mutant's diff changes. Planting edits `epp/` in place: run nothing else from the checkout meanwhile.
`--by-hand TESTS NAME...` checks named mutants against TESTS (test paths, space-separated) without
mutmut: each mutant's changed lines are swapped into `epp/` by hand, TESTS run (stopping at the
first failure), and the file is restored whatever happens. Prints KILLED with the first failing
line, or SURVIVES (the way to show one new test failing with its mutant planted); stops when pytest
could not run TESTS at all.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
DEFAULT_PACKAGES = ("controller", "datastore", "k8s", "scheduling", "handlers", "h2")
# mutmut's exit-code verdicts (mutmut.stats.status_by_exit_code) folded into what the rate counts:
# a timeout or a type-check failure also means the mistake did not pass unnoticed.
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
UNCOUNTED = {"not checked", "skipped", "check was interrupted by user"}
STAGE_VERDICTS = ROOT / "mutants" / "integration-verdicts.json"  # see mutation_integration.py
# A mutant that changes only the arguments of a logging call (the message, its %-arguments) leaves
# behaviour unchanged: counted apart as "log text", explained, never a gap in the tests.
LOG_CALL = re.compile(r"^(log|logger|_log|logging)\.(debug|info|warning|error|exception|critical)\(")


def ensure_mutmut() -> None:
    """mutmut from its lock, only when it is missing (the test command never needs it)."""
    if importlib.util.find_spec("mutmut") is not None:
        return
    lock = ROOT / "requirements" / "mutation.txt"
    print(f"==> installing mutmut from {lock.relative_to(ROOT)}", flush=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps"]
    subprocess.run([*pip, "-r", str(lock)], check=True)


def run(package: str, max_children: int, names: Sequence[str] = ()) -> float:
    """mutmut on the package's mutants not yet checked, or on ``names`` again (whatever they got)."""
    began = time.monotonic()
    command = [
        str(VENV_BIN / "mutmut"),
        "run",
        "--max-children",
        str(max_children),
        *(names or [f"epp.{package}.*"]),
    ]
    shown = command[1:] if not names else [*command[1:4], f"<{len(names)} mutants by name>"]
    print(f"==> {' '.join(shown)}", flush=True)
    # mutmut draws a spinner on stdout; its verdicts are read from mutants/ afterwards.
    subprocess.run(command, cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    return time.monotonic() - began


def verdicts(package: str) -> dict[str, str]:
    """Mutant name -> mutmut's verdict, for every mutant of ``epp/<package>/``."""
    from mutmut.stats import status_by_exit_code

    out: dict[str, str] = {}
    for meta in sorted((ROOT / "mutants" / "epp" / package).rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        out.update({name: status_by_exit_code[code] for name, code in codes.items()})
    return out


def changes_only_a_log_call(diff: str) -> bool:
    """Whether every line a mutant's diff removes or adds is a logging call (see `LOG_CALL`)."""
    changed = [
        line[1:].strip()
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return bool(changed) and all(LOG_CALL.match(line) for line in changed)


def mutant_diff(name: str) -> str:
    shown = subprocess.run(
        [str(VENV_BIN / "mutmut"), "show", name], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return shown.stdout


def changed_lines(diff: str) -> tuple[list[str], list[str], str]:
    """(lines removed, lines added, the file) of a `mutmut show` diff."""
    lines = diff.splitlines()
    path = next((line[4:].strip() for line in lines if line.startswith("--- ")), None)
    if path is None:
        raise SystemExit(f"not a mutant's diff (is the name one `mutmut show` knows?): {diff[:200]!r}")
    removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    return removed, added, path


def removed_offset(diff: str) -> int | None:
    """The line offset, from the mutated function's first line, of the first removed line: mutmut's
    hunk header counts from the function's own start (line 1). None without a hunk header."""
    offset = None
    for line in diff.splitlines():
        if offset is None:
            if found := re.match(r"@@ -(\d+)", line):
                offset = int(found.group(1)) - 1
        elif line.startswith("-"):
            return offset
        elif not line.startswith("+"):
            offset += 1
    return None


def mutated_function(name: str) -> tuple[str | None, str]:
    """(class or None, function) a mutant's name says it is in: `pkg.mod.xǁClassǁmethod__mutmut_7`,
    `pkg.mod.x_function__mutmut_7`."""
    last = name.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    if last.startswith("xǁ"):
        cls, _, method = last[2:].partition("ǁ")
        return cls, method
    return None, last.removeprefix("x_")


def function_start(source: str, cls: str | None, function: str) -> int:
    """The line index of `function`'s def (inside `class cls` when given); 0 when not found."""
    lines = source.split("\n")
    start = 0
    if cls is not None:
        start = next((i for i, line in enumerate(lines) if re.match(rf"class {re.escape(cls)}\b", line)), 0)
    pattern = re.compile(rf"\s*(async\s+)?def {re.escape(function)}\(")
    return next((i for i in range(start, len(lines)) if pattern.match(lines[i])), 0)


def apply_mutant(
    source: str, removed: Sequence[str], added: Sequence[str], from_line: int = 0, offset: int | None = None
) -> str | None:
    """`source` with a run of `removed` lines (compared without indentation) at or after line index
    `from_line` (the mutated function's def: the same lines may be in other functions too) replaced
    by `added`, each at the indentation of the line it replaces; None if they are not there. The
    run taken is the one nearest `from_line + offset` (the same line may be twice in one function,
    as in two `except` branches), the first one without an offset.

    mutmut's diffs are of the function alone, dedented and with their own line numbers, so they
    cannot go through `patch`."""
    if not removed:
        return None
    lines = source.split("\n")
    wanted = [line.strip() for line in removed]
    found = [
        i
        for i in range(from_line, len(lines) - len(wanted) + 1)
        if [line.strip() for line in lines[i : i + len(wanted)]] == wanted
    ]
    if not found:
        return None
    i = found[0] if offset is None else min(found, key=lambda at: abs(at - (from_line + offset)))
    indents = [line[: len(line) - len(line.lstrip())] for line in lines[i : i + len(wanted)]]
    replaced = [indents[min(k, len(indents) - 1)] + line.strip() for k, line in enumerate(added)]
    return "\n".join([*lines[:i], *replaced, *lines[i + len(wanted) :]])


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def planted(name: str) -> Iterator[bool]:
    """The mutant's changed lines swapped into `epp/` for the block (True), the file restored whatever
    happens; False, nothing changed, when its lines are not in the file (it changed since the run)."""
    diff = mutant_diff(name)
    removed, added, path = changed_lines(diff)
    target = ROOT / path
    original = target.read_text()
    start = function_start(original, *mutated_function(name))
    mutated = apply_mutant(original, removed, added, start, removed_offset(diff))
    if mutated is None:
        print(f"NOT APPLIED {name}: its lines are not in {path} (changed since the run?)")
        yield False
        return
    try:
        target.write_text(mutated)
        yield True
    finally:
        target.write_text(original)


# pytest's exit codes: 0 all passed, 1 some failed; anything else (interrupted, an internal error, a
# usage error such as a path that does not exist, no tests collected) says nothing about the mutant.
PASSED, FAILED = 0, 1


def run_tests(tests: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """pytest on `tests` from the checkout, stopping at the first failure: (exit code, first failing
    line). Exits when pytest could not run them (a wrong path must not count as a killed mutant)."""
    pytest = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    ran = subprocess.run(pytest, cwd=ROOT, capture_output=True, text=True, check=False, env=env)
    if ran.returncode not in (PASSED, FAILED):
        said = (ran.stdout + ran.stderr).strip().splitlines()[-3:]
        raise SystemExit(
            f"pytest {' '.join(tests)} did not run (exit code {ran.returncode}): {' | '.join(said)}"
        )
    failure = next((line for line in ran.stdout.splitlines() if line.startswith(("E ", "FAILED"))), "")
    return ran.returncode, failure


def by_hand(tests: str, names: Sequence[str]) -> int:
    """Apply each mutant by hand, run `tests`, restore; how many survived.

    SIGTERM is turned into an interrupt, so a `kill` (or SIGINT, which a shell's background job
    ignores) still restores the file a mutant is in."""
    signal.signal(signal.SIGTERM, _interrupted)
    survived = 0
    for name in names:
        with planted(name) as applied:
            if not applied:
                continue
            code, failure = run_tests(tests.split())
        if code:
            print(f"KILLED    {name}: {failure[:160]}")
        else:
            survived += 1
            print(f"SURVIVES  {name}")
    return survived


def report(package: str, found: dict[str, str], seconds: float | None) -> None:
    """The package's kill rate and its survivors, the integration stage's verdicts (if any) counted in."""
    stage = integration_stage()
    stage_verdicts = stage.Verdicts(STAGE_VERDICTS)
    diffs = {n: mutant_diff(n) for n, status in found.items() if status not in KILLED | UNCOUNTED}
    for name, diff in diffs.items():
        if stage_verdicts.get(name, diff) == stage.KILLED:
            found[name] = stage.KILLED
    counts = collections.Counter(found.values())
    decided = sum(n for status, n in counts.items() if status not in UNCOUNTED)
    killed = sum(counts[status] for status in (*KILLED, stage.KILLED))
    survivors = sorted(n for n in diffs if found[n] != stage.KILLED)
    log_text = {n for n in survivors if changes_only_a_log_call(diffs[n])}
    rate = f"{100 * killed / decided:.1f}%" if decided else "-"
    behaviour = decided - len(log_text)
    behaviour_rate = f"{100 * killed / behaviour:.1f}%" if behaviour else "-"
    took = f", {seconds:.0f} s" if seconds is not None else ""
    detail = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
    print(f"epp/{package}: kill rate {rate} ({killed} of {decided} checked{took}); {detail}")
    print(
        f"epp/{package}: {len(log_text)} survivors change only a log call's text or arguments; "
        f"kill rate without them {behaviour_rate} ({killed} of {behaviour})"
    )
    for name in survivors:
        label = "log text" if name in log_text else found[name]
        if label != "log text" and stage_verdicts.get(name, diffs[name]) == stage.SURVIVED:
            label = "survived unit + integration"
        print(f"    {label:10} {name}")  # as `mutmut show` takes it


def integration_stage() -> ModuleType:
    """`mutation_integration`, beside this file (imported late: `--by-hand` never needs it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        return importlib.import_module("mutation_integration")
    finally:
        sys.path.pop(0)


def integration(packages: Sequence[str]) -> None:
    """The unit tier's behaviour-changing survivors of each package against its integration subset,
    one control plane for all; SIGTERM restores the file of the mutant planted at the time."""
    signal.signal(signal.SIGTERM, _interrupted)
    stage = integration_stage()
    stage_verdicts = stage.Verdicts(STAGE_VERDICTS)
    with stage.shared_plane() as env:
        for package in packages:
            survivors = [
                n
                for n, status in verdicts(package).items()
                if status not in KILLED | UNCOUNTED and not changes_only_a_log_call(mutant_diff(n))
            ]
            print(
                f"==> epp/{package}: {len(survivors)} unit-tier survivors against "
                f"{' '.join(stage.SUBSET_BY_PACKAGE[package])}",
                flush=True,
            )
            began = time.monotonic()
            checked = stage.check(
                package,
                survivors,
                stage_verdicts,
                diff_of=mutant_diff,
                planted=planted,
                run_tests=run_tests,
                env=env,
            )
            print(f"==> epp/{package}: {checked} checked in {time.monotonic() - began:.0f} s", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("packages", nargs="*", metavar="PACKAGE")
    parser.add_argument("--max-children", type=int, default=2, help="mutants checked at once")
    parser.add_argument("--report-only", action="store_true", help="print what mutants/ holds, run nothing")
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="check the packages' survivors again (after new tests: mutmut picks up the new tests first)",
    )
    parser.add_argument(
        "--integration",
        action="store_true",
        help="no mutmut run: check the survivors of its last run against the package's fast integration "
        "subset (benchmarks/mutation_integration.py), one control plane for all",
    )
    parser.add_argument(
        "--by-hand",
        metavar="TESTS",
        help="apply the mutants named in place of packages by hand, run TESTS",
    )
    args = parser.parse_args(argv)
    if args.by_hand:
        if not args.packages:
            parser.error("--by-hand needs the names of the mutants to apply")
        ensure_mutmut()
        return 1 if by_hand(args.by_hand, args.packages) else 0
    packages = args.packages or list(DEFAULT_PACKAGES)
    unknown = [p for p in packages if not (ROOT / "epp" / p).is_dir()]
    if unknown:
        parser.error(f"not a package of epp/: {', '.join(unknown)}")
    ensure_mutmut()
    seconds: dict[str, float | None] = {}
    for package in packages:
        again: list[str] = []
        if args.survivors:
            again = [n for n, status in verdicts(package).items() if status not in KILLED | UNCOUNTED]
            print(f"==> epp/{package}: {len(again)} survivors checked again", flush=True)
        seconds[package] = (
            None
            if args.report_only or args.integration or (args.survivors and not again)
            else run(package, args.max_children, again)
        )
    if args.integration and not args.report_only:
        integration(packages)
    for package in packages:
        report(package, verdicts(package), seconds[package])
    return 0


if __name__ == "__main__":
    sys.exit(main())
