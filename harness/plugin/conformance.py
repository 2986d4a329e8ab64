"""pytest wiring for "any EPP under test" (entry point ``pytest11: harness_conformance``).

* ``--epp-command CMD`` (or ``$EPP_HARNESS_EPP_COMMAND``): the e2e Stacks run this EPP instead of ours
  (`harness.beds.stack.StackOptions.epp_command`). ``CMD`` is a shell-style command line that takes
  upstream's flag names (``/opt/epp -zap-devel``), or ``ours`` (our EPP through the same launcher),
  or ``upstream`` / ``upstream:v0.3.0`` (the binary of ``harness build --upstream-epp``). A command
  line of unknown provenance is assumed to bind controller-runtime's ``:8080`` as upstream's does
  (``harness.subject.foreign_epp.CONTROLLER_RUNTIME_METRICS_PORT``), so two never run at once on a host;
  ``--epp-fixed-ports=`` (empty) or a comma list says otherwise. ``--epp-flags PROFILE`` (or
  ``$EPP_HARNESS_EPP_FLAGS``) names its flag dialect (`harness.subject.flag_profiles`: ``v0.3``,
  ``v1``, ``lwepp``), read off its ``--help`` when not given; a profile that does not fit stops the
  run at once with the flag named, before any scenario.
* ``@pytest.mark.needs(capability)``: a test that needs a capability the EPP under test lacks
  (``EppCommand.lacks``: its flag profile's, or ``--epp-lacks`` / ``$EPP_HARNESS_EPP_LACKS``, a comma
  list, ``""`` for none) is skipped as *not applicable* and recorded so (``not_applicable``).
  With an EPP command, only tests marked ``epp_agnostic`` run: the rest read our EPP's datastore
  view or pass our flags, and are skipped saying so.
* The markers of `harness.verdicts.departures` (``epp_agnostic``, ``departure(name)``, ``upstream_bug(name)``)
  are registered here; an unknown name fails the run.
* Evidence: when a test that holds a Stack fails, the report gets a section ``conformance evidence``
  (`harness.beds.stack.Stack.evidence`: the last requests through Envoy and the pods that got them).
* ``--conformance-json PATH`` writes one record per test (outcome, markers, message, evidence) for
  ``harness conformance`` to render; under xdist the controller collects and writes it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any, Final

import pytest

from harness.base.binaries import BinaryNotFoundError
from harness.subject import flag_profiles
from harness.subject.foreign_epp import CONTROLLER_RUNTIME_METRICS_PORT, EppCommand
from harness.verdicts import departures

EPP_COMMAND_ENV: Final = "EPP_HARNESS_EPP_COMMAND"
EPP_FLAGS_ENV: Final = "EPP_HARNESS_EPP_FLAGS"
EPP_LACKS_ENV: Final = "EPP_HARNESS_EPP_LACKS"
_COMMAND: Final = pytest.StashKey["EppCommand | BinaryNotFoundError"]()
_PROPERTY: Final = "conformance"
_MESSAGE_CHARS: Final = 600


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness-conformance", "any EPP under test")
    group.addoption(
        "--epp-command",
        default=None,
        help="run the e2e Stacks with this EPP command line (upstream flag names), 'ours', or "
        f"'upstream[:vX.Y.Z]'; only epp_agnostic tests run (env {EPP_COMMAND_ENV})",
    )
    group.addoption(
        "--epp-fixed-ports",
        default=None,
        help="comma list of ports the --epp-command binds whatever its flags say "
        f"(default {CONTROLLER_RUNTIME_METRICS_PORT}; empty for none)",
    )
    group.addoption(
        "--epp-flags",
        default=None,
        metavar="PROFILE",
        help=f"the --epp-command's flag dialect: {', '.join(flag_profiles.PROFILES)} (default: read off "
        f"its --help; env {EPP_FLAGS_ENV})",
    )
    group.addoption(
        "--epp-lacks",
        default=None,
        metavar="CAPABILITIES",
        help=f"comma list of capabilities the --epp-command lacks ({', '.join(departures.CAPABILITIES)}); "
        f"tests that need one are not applicable to it (default: its flag profile's; env {EPP_LACKS_ENV})",
    )
    group.addoption("--conformance-json", default=None, help="write each test's conformance record here")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{departures.EPP_AGNOSTIC}: drives the system only through Envoy and the API server: runs "
        "against any EPP (--epp-command)",
    )
    config.addinivalue_line(
        "markers",
        f"{departures.DEPARTURE}(name): checks a deliberate departure from upstream "
        f"(one of {', '.join(departures.DEPARTURES)})",
    )
    config.addinivalue_line(
        "markers",
        f"{departures.UPSTREAM_BUG}(name): checks behaviour a known upstream bug breaks "
        f"(one of {', '.join(departures.UPSTREAM_BUGS)})",
    )
    config.addinivalue_line(
        "markers",
        f"{departures.NEEDS}(capability): only for an EPP with that capability; not applicable to one "
        f"that lacks it (one of {', '.join(departures.CAPABILITIES)})",
    )
    text = command_text(config)
    if text is not None:
        flags = config.getoption("epp_flags") or os.environ.get(EPP_FLAGS_ENV) or None
        try:
            command = EppCommand.from_text(text, config.getoption("epp_fixed_ports"), flags)
            config.stash[_COMMAND] = dataclasses.replace(command, lacks_override=lacks_option(config))
        except BinaryNotFoundError as exc:  # an upstream release not built: each scenario skips, saying so
            config.stash[_COMMAND] = exc
        except flag_profiles.FlagProfileError as exc:
            raise pytest.UsageError(f"--epp-command {text!r}: {exc}") from exc
    path = config.getoption("conformance_json")
    if path and getattr(config, "workerinput", None) is None:
        config.pluginmanager.register(_Recorder(config, Path(path)), "harness-conformance-recorder")


def lacks_option(config: pytest.Config) -> frozenset[str] | None:
    """``--epp-lacks`` (or its variable) as a set of known capabilities; None when neither is given."""
    text = config.getoption("epp_lacks")
    if text is None:
        text = os.environ.get(EPP_LACKS_ENV)
    if text is None:
        return None
    names = frozenset(name.strip() for name in str(text).split(",") if name.strip())
    unknown = sorted(names - departures.CAPABILITIES.keys())
    if unknown:
        raise pytest.UsageError(
            f"--epp-lacks: unknown capabilities {', '.join(unknown)}: name some of "
            f"{', '.join(departures.CAPABILITIES)}"
        )
    return names


def not_applicable(item: pytest.Item, command: EppCommand) -> list[str]:
    """The capabilities ``item`` needs (``@pytest.mark.needs``) that ``command`` lacks, sorted."""
    needed = {str(m.args[0]) for m in item.iter_markers(departures.NEEDS) if m.args}
    return sorted(needed & command.lacks)


def command_text(config: pytest.Config) -> str | None:
    text = config.getoption("epp_command") or os.environ.get(EPP_COMMAND_ENV) or None
    return str(text) if text else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for kind, catalogue in (
            (departures.DEPARTURE, departures.DEPARTURES),
            (departures.UPSTREAM_BUG, departures.UPSTREAM_BUGS),
            (departures.NEEDS, departures.CAPABILITIES),
        ):
            for marker in item.iter_markers(kind):
                if len(marker.args) != 1 or marker.args[0] not in catalogue:
                    raise pytest.UsageError(
                        f"{item.nodeid}: @pytest.mark.{kind}{marker.args!r}: name one of {sorted(catalogue)}"
                    )
    if command_text(config) is None:
        return
    skip = pytest.mark.skip(
        reason="not EPP-agnostic (reads our datastore view or passes our flags): skipped with --epp-command"
    )
    command = config.stash.get(_COMMAND, None)
    for item in items:
        if item.get_closest_marker(departures.EPP_AGNOSTIC) is None:
            item.add_marker(skip)
        elif isinstance(command, EppCommand):
            missing = not_applicable(item, command)
            if missing:
                reasons = "; ".join(f"{name} ({departures.CAPABILITIES[name]})" for name in missing)
                item.add_marker(pytest.mark.skip(reason=f"not applicable: {command.name} lacks {reasons}"))


@pytest.fixture(scope="session")
def epp_command(pytestconfig: pytest.Config) -> EppCommand | None:
    """The EPP the e2e Stacks run (``--epp-command``), or None for ours as `EppProcess` runs it."""
    command = pytestconfig.stash.get(_COMMAND, None)
    if isinstance(command, BinaryNotFoundError):
        pytest.skip(str(command))
    return command


def _marker_name(item: pytest.Item, kind: str) -> str | None:
    marker = item.get_closest_marker(kind)
    return str(marker.args[0]) if marker is not None and marker.args else None


def _start_notes(error: BaseException | None) -> list[str]:
    """What a Stack that failed to start noted on its error (``Stack._on_failed_start``)."""
    stack_module = sys.modules.get("harness.beds.stack")
    if stack_module is None:
        return []
    notes = getattr(error, "__notes__", None) or []
    return [str(note) for note in notes if str(note).startswith(stack_module.EVIDENCE_NOTE)]


def _evidence(item: pytest.Item, error: BaseException | None) -> str:
    stack_module = sys.modules.get("harness.beds.stack")
    if stack_module is None:
        return ""
    started = _start_notes(error)
    if started:  # a Stack that failed to start noted what it had seen before it stopped
        return "\n".join(note.split("\n", 1)[-1] for note in started)
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    stacks = {id(v): v for v in funcargs.values() if isinstance(v, stack_module.Stack)}
    stacks.update({id(s): s for s in item.stash.get(STARTED_STACKS, [])})
    parts = []
    for stack in stacks.values():
        try:
            parts.append(stack.evidence())
        except Exception as exc:  # evidence is best effort: never mask the test's own failure
            parts.append(f"(evidence unavailable: {type(exc).__name__}: {exc})")
    return "\n".join(parts)


STARTED_STACKS = pytest.StashKey[list[Any]]()
"""Stacks a test started through ``stack_factory`` (the fixture records them for the evidence)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    error = call.excinfo.value if call.excinfo is not None else None
    evidence = _evidence(item, error) if report.failed and call.when in ("setup", "call") else ""
    if evidence:
        report.sections.append(("conformance evidence", evidence))
    message = ""
    if call.excinfo is not None:
        message = call.excinfo.exconly()[:_MESSAGE_CHARS]
    command = item.config.stash.get(_COMMAND, None)
    record = {
        "agnostic": item.get_closest_marker(departures.EPP_AGNOSTIC) is not None,
        "not_applicable": not_applicable(item, command) if isinstance(command, EppCommand) else [],
        "departure": _marker_name(item, departures.DEPARTURE),
        "upstream_bug": _marker_name(item, departures.UPSTREAM_BUG),
        "message": message,
        "evidence": evidence,
        # A Stack that never started is no behaviour of the EPP's to call a departure.
        "stack_start_failed": bool(_start_notes(error)),
    }
    report.user_properties.append((_PROPERTY, json.dumps(record)))


class _Recorder:
    """The run's owner (not an xdist worker): one record per test, written at the end of the session."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self._config = config
        self._path = path
        self._records: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if _PROPERTY not in props:
            return
        record = json.loads(str(props[_PROPERTY]))
        entry = self._records.get(report.nodeid)
        if report.skipped and isinstance(report.longrepr, tuple):
            record["message"] = str(report.longrepr[2])
        if report.when == "setup":
            if not report.passed:
                outcome = "skipped" if report.skipped else "error"
                self._records[report.nodeid] = {"nodeid": report.nodeid, "outcome": outcome, **record}
        elif report.when == "call":
            self._records[report.nodeid] = {"nodeid": report.nodeid, "outcome": report.outcome, **record}
        elif report.failed and entry is not None and entry["outcome"] == "passed":
            entry.update(outcome="error", message=record["message"] or "teardown failed")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A module that does not even import is a failure of every scenario in it: say so."""
        if report.failed:
            message = str(report.longrepr).strip().splitlines()[-1:] or ["collection failed"]
            self._records[report.nodeid] = {
                "nodeid": report.nodeid, "outcome": "error", "agnostic": True, "departure": None,
                "upstream_bug": None, "message": f"collection failed: {message[0]}"[:_MESSAGE_CHARS],
                "evidence": "", "stack_start_failed": False, "not_applicable": [],
            }  # fmt: skip

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        records = sorted(self._records.values(), key=lambda r: str(r["nodeid"]))
        document = {"epp_command": command_text(self._config), "tests": records}
        self._path.write_text(json.dumps(document, indent=1))
