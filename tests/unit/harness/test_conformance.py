"""The conformance plumbing without any EPP: markers and records (`harness.plugin.conformance`), the
report's classification (`harness.cli.conformance`), and the traffic oracle's bound and judgement."""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from harness.cli.conformance import Row, classify, markdown, render
from harness.subject.foreign_epp import CONTROLLER_RUNTIME_METRICS_PORT, EppCommand
from harness.verdicts.traffic_oracle import _judge, requests_needed

from .fake_epps import LWEPP_HELP, V0_3_HELP, V1_HELP, fake_epp

INNER_TESTS = """
import pytest

@pytest.mark.epp_agnostic
def test_agnostic_pass():
    pass

@pytest.mark.epp_agnostic
@pytest.mark.departure("503-no-endpoints")
def test_agnostic_departure():
    assert 429 == 503, "no ready pod answered 429"

@pytest.mark.epp_agnostic
@pytest.mark.upstream_bug("request-error-total-never-incremented")
def test_agnostic_bug():
    assert False, "no sample"

def test_ours_only():
    pass
"""


def test_records_name_the_departure_and_the_bug(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=INNER_TESTS)
    out = pytester.path / "records.json"
    result = pytester.runpytest_inprocess("-p", "no:randomly", f"--conformance-json={out}")
    result.assert_outcomes(passed=2, failed=2)

    records = {r["nodeid"].split("::")[1]: r for r in json.loads(out.read_text())["tests"]}
    assert {name: classify(r) for name, r in records.items()} == {
        "test_agnostic_pass": "pass",
        "test_agnostic_departure": "differs by design: 503-no-endpoints",
        "test_agnostic_bug": "upstream bug: request-error-total-never-incremented",
        "test_ours_only": "pass",
    }
    assert "no ready pod answered 429" in records["test_agnostic_departure"]["message"]


def test_an_epp_command_runs_only_the_agnostic_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=INNER_TESTS)
    epp = fake_epp(pytester.path, V1_HELP)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-rs", f"--epp-command={epp} --x")
    result.assert_outcomes(passed=1, failed=2, skipped=1)
    result.stdout.fnmatch_lines(["*not EPP-agnostic*"])


def test_an_unknown_departure_name_stops_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner="""
import pytest

@pytest.mark.departure("faster-than-light")
def test_x():
    pass
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*faster-than-light*name one of*"])


def test_a_setup_error_is_a_failure_even_for_a_departure() -> None:
    assert classify({"outcome": "error", "departure": "staleness", "upstream_bug": None}) == "FAIL"
    stack_never_started = {"outcome": "failed", "departure": "staleness", "stack_start_failed": True}
    assert classify(stack_never_started) == "FAIL"


def test_a_scenario_of_the_other_api_generation_is_not_applicable() -> None:
    """``@pytest.mark.api_generation("v1")`` in a v1alpha2 run (harness.plugin.core's skip text)."""
    record = {
        "outcome": "skipped",
        "not_applicable": [],
        "message": "Skipped: not applicable: written for API generation v1, this run is v1alpha2",
    }
    assert classify(record) == "not applicable: API generation v1"
    assert classify({"outcome": "skipped", "not_applicable": [], "message": "Skipped: no"}) == "skipped"


def test_the_report_shows_evidence_for_failures_only() -> None:
    rows = [
        Row("test_a::pass", "pass", "", ""),
        Row("test_a::differs", "differs by design: staleness", "stale pod won", "EVIDENCE-DIFFERS"),
        Row("test_a::bug", "upstream bug: 713-resync-adds-deleting-pods", "leaving=27", "EVIDENCE-BUG"),
        Row("test_a::fail", "FAIL", "served by nobody", "POST /v1/completions -> 503, no pod"),
    ]
    out = io.StringIO()
    render("upstream:0.3.0", rows, out)
    text = out.getvalue()
    assert "differs by design: staleness" in text
    assert "known upstream bugs shown: 713-resync-adds-deleting-pods" in text
    assert "--- evidence: test_a::fail" in text
    assert "POST /v1/completions -> 503, no pod" in text
    assert "EVIDENCE-DIFFERS" not in text
    assert "EVIDENCE-BUG" not in text


def test_the_markdown_summary_is_one_row_per_scenario_with_failures_folded() -> None:
    rows = [
        Row("test_a::pass", "pass", "", ""),
        Row("test_a::fail", "FAIL", "got 503 | not 200", "POST /v1/completions -> 503, no pod"),
        Row("test_a::bug", "upstream bug: 713-resync-adds-deleting-pods", "leaving=27", "EVIDENCE-BUG"),
    ]
    text = markdown("upstream:0.3.0", rows)
    lines = text.splitlines()
    assert lines[0] == "### EPP conformance: `upstream:0.3.0`"
    assert "1 FAIL, 1 pass, 1 upstream bug" in lines
    table = [line for line in lines if line.startswith("| test_")]
    assert table == [
        "| test_a::pass | pass |   |",
        "| test_a::fail | FAIL | got 503 \\| not 200 |",
        "| test_a::bug | upstream bug: 713-resync-adds-deleting-pods | leaving=27 |",
    ]
    assert "<details><summary>evidence: test_a::fail</summary>" in lines
    assert "POST /v1/completions -> 503, no pod" in lines
    assert "EVIDENCE-BUG" not in text


def test_epp_command_text(tmp_path: Path) -> None:
    assert EppCommand.from_text("ours").dialect == "ours"
    epp = str(fake_epp(tmp_path, V0_3_HELP))
    foreign = EppCommand.from_text(f"{epp} --flag 'a b'")
    assert foreign.argv == (epp, "--flag", "a b")
    assert foreign.dialect == "upstream"
    assert foreign.fixed_ports == (CONTROLLER_RUNTIME_METRICS_PORT,)
    assert EppCommand.from_text(epp, fixed_ports="").fixed_ports == ()
    assert EppCommand.from_text(epp, fixed_ports="8080,9090").fixed_ports == (8080, 9090)


# ---------------------------------------------------------------------------------- traffic oracle


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_the_bound_holds_for_a_picker_half_as_fair_as_uniform(k: int) -> None:
    n = requests_needed(k)
    assert k * (1 - 0.5 / k) ** n <= 1e-5
    assert k * (1 - 0.5 / k) ** (n - 5) > 1e-5 * math.exp(-3), "N is not wildly more than needed"


def test_a_round_names_a_missing_member_and_a_non_member_with_traffic() -> None:
    verdict = _judge(frozenset({"a", "b"}), {"a": 10, "b": 0, "leaving": 4}, Counter({200: 14}), 14, "m", 0)
    assert not verdict.consistent
    assert "members that got no request in 14: ['b']" in verdict.summary()
    assert "non-members that got traffic: leaving=4" in verdict.summary()


def test_with_no_members_every_request_must_fail_and_reach_no_pod() -> None:
    assert _judge(frozenset(), {"a": 0}, Counter({503: 24}), 24, "m", 0).consistent
    served = _judge(frozenset(), {"a": 0}, Counter({200: 1, 503: 23}), 24, "m", 1)
    assert "1 requests answered 200 with no member" in served.summary()
    assert "answered by a simulator that is no pod of the pool" in served.summary()


def test_failed_requests_with_members_are_inconsistent() -> None:
    verdict = _judge(frozenset({"a"}), {"a": 20}, Counter({200: 20, 502: 4}), 24, "m", 0)
    assert "4 of 24 requests failed" in verdict.summary()


def test_a_module_that_does_not_import_is_recorded_as_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_broken="from nowhere import nothing\n")
    out = pytester.path / "records.json"
    pytester.runpytest_inprocess("-p", "no:randomly", f"--conformance-json={out}")

    [record] = json.loads(out.read_text())["tests"]
    assert classify(record) == "FAIL"
    assert "nowhere" in record["message"]


FAILURES_OUTSIDE_THE_EPP = """
import pytest
from harness.beds.stack import EVIDENCE_NOTE

@pytest.mark.epp_agnostic
@pytest.mark.departure("staleness")
def test_stack_never_started():
    error = RuntimeError("epp exited during start")
    error.add_note(EVIDENCE_NOTE + "\\nEPP under test: x")
    raise error

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("left a process behind")

@pytest.mark.epp_agnostic
def test_passes_then_its_teardown_fails(broken_teardown):
    pass
"""


def test_a_stack_that_never_started_and_a_failed_teardown_are_recorded_as_failures(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_inner=FAILURES_OUTSIDE_THE_EPP)
    out = pytester.path / "records.json"
    pytester.runpytest_inprocess("-p", "no:randomly", f"--conformance-json={out}")

    records = {r["nodeid"].split("::")[1]: r for r in json.loads(out.read_text())["tests"]}
    never_started = records["test_stack_never_started"]
    assert never_started["stack_start_failed"] is True
    assert classify(never_started) == "FAIL", "a Stack that never started is no departure"
    teardown = records["test_passes_then_its_teardown_fails"]
    assert (teardown["outcome"], classify(teardown)) == ("error", "FAIL")
    assert "left a process behind" in teardown["message"]


NEEDS_TESTS = """
import pytest

pytestmark = pytest.mark.epp_agnostic

@pytest.mark.needs("load-aware-picking")
def test_picks_the_idle_pod():
    assert False, "round robin picked the busy pod"

def test_routes_to_a_pool_pod():
    pass
"""


@pytest.mark.parametrize(
    ("help_text", "lacks", "outcomes", "picks"),
    [
        pytest.param(
            LWEPP_HELP, None, {"passed": 1, "skipped": 1}, "not applicable: load-aware-picking", id="lwepp"
        ),
        pytest.param(V1_HELP, None, {"passed": 1, "failed": 1}, "FAIL", id="full-epp-runs-it"),
        pytest.param(LWEPP_HELP, "", {"passed": 1, "failed": 1}, "FAIL", id="lwepp-told-it-lacks-nothing"),
        pytest.param(
            V1_HELP, "load-aware-picking", {"passed": 1, "skipped": 1}, "not applicable: load-aware-picking",
            id="full-epp-told-it-lacks-it",
        ),
    ],
)  # fmt: skip
def test_a_scenario_needing_what_the_epp_lacks_is_not_applicable_never_a_fail(
    pytester: pytest.Pytester, help_text: str, lacks: str | None, outcomes: dict[str, int], picks: str
) -> None:
    pytester.makepyfile(test_inner=NEEDS_TESTS)
    epp = fake_epp(pytester.path, help_text)
    out = pytester.path / "records.json"
    argv = ["-p", "no:randomly", "-rs", f"--epp-command={epp}", f"--conformance-json={out}"]
    if lacks is not None:
        argv.append(f"--epp-lacks={lacks}")
    result = pytester.runpytest_inprocess(*argv)
    result.assert_outcomes(**outcomes)
    records = {r["nodeid"].split("::")[1]: r for r in json.loads(out.read_text())["tests"]}
    assert classify(records["test_picks_the_idle_pod"]) == picks
    assert classify(records["test_routes_to_a_pool_pod"]) == "pass"
    if picks.startswith("not applicable"):
        result.stdout.fnmatch_lines(["*not applicable: epp lacks load-aware-picking (picks by the pods' *"])


def test_an_unknown_capability_stops_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner='import pytest\n\n@pytest.mark.needs("telepathy")\ndef test_x(): pass\n')
    result = pytester.runpytest_inprocess("-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*telepathy*name one of*"])
    epp = fake_epp(pytester.path, V1_HELP)
    argv = ["-p", "no:randomly", f"--epp-command={epp}", "--epp-lacks=x,telepathy"]
    result = pytester.runpytest_inprocess(*argv)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--epp-lacks: unknown capabilities telepathy, x*"])


def test_the_report_names_what_the_epp_lacks() -> None:
    rows = [
        Row("test_a::pass", "pass", "", ""),
        Row("test_a::na", "not applicable: load-aware-picking", "not applicable: ...", ""),
    ]
    out = io.StringIO()
    render("lwepp", rows, out)
    text = out.getvalue()
    assert "1 not applicable, 1 pass" in text
    assert "capabilities this EPP lacks: load-aware-picking (picks by the pods' load" in text
