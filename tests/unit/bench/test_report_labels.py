"""Every ratio the routing report prints names the workload it was measured on (it used to say
"shared-prefix workload" whatever the run measured), in live and virtual mode alike."""

from __future__ import annotations

import dataclasses

import pytest

from harness.cli.bench import report
from harness.cli.bench.runner import BenchConfig, BenchResult
from harness.cli.bench.stats import RunResult


def run(policy: str, p90: float, goodput: float = 10.0) -> RunResult:
    pct = {"p50": p90 / 2, "p90": p90, "p99": p90 * 2}
    return RunResult(policy, 0.9, 0, 100, 100, 0, 0, pct, pct, pct, 10.0, 100.0, goodput, 1.0)


LIVE = ("epp", "envoy-round-robin", "envoy-least-request", "oracle", "sglang-router:cache_aware")
VIRTUAL = ("epp", "round-robin", "least-outstanding", "upstream-v1.5-default", "oracle", "random")


@pytest.mark.parametrize(
    ("mode", "workload", "policies"),
    [
        pytest.param("live", "sharegpt", LIVE, id="live-sharegpt"),
        pytest.param("live", "shared-prefix", LIVE, id="live-shared-prefix"),
        pytest.param("virtual", "lora", VIRTUAL, id="virtual-lora"),
        pytest.param("virtual", "prefix-heavy", VIRTUAL, id="virtual-prefix-heavy"),
    ],
)
def test_each_ratio_names_the_workload_of_its_run(
    mode: str, workload: str, policies: tuple[str, ...]
) -> None:
    result = BenchResult(BenchConfig(loads=(0.9,), repeats=1, workload_name=workload, mode=mode))
    result.policies = list(policies)
    result.runs = [run(p, 0.1 + 0.01 * i) for i, p in enumerate(policies)]
    found = report.ratios(result)
    assert len(found) >= 4
    for ratio in found:
        assert ratio.workload == workload
        assert f"on the {workload} workload" in ratio.line()
    others = {"sharegpt", "shared-prefix", "lora", "prefix-heavy"} - {workload}
    text = report.markdown(result)
    assert not any(f"on the {o} workload" in text for o in others)
    assert f"workload: {workload}," in text


def test_virtual_ratios_compare_with_the_issues_peers() -> None:
    result = BenchResult(BenchConfig(loads=(0.9,), repeats=1, workload_name="sharegpt", mode="virtual"))
    result.policies = list(VIRTUAL)
    result.runs = [
        run("epp", 0.1, goodput=30),
        run("round-robin", 0.4),
        run("least-outstanding", 0.1),
        run("upstream-v1.5-default", 0.2),
        run("oracle", 0.1, goodput=31),
        run("random", 0.5),
        run("epp[last-routed]", 0.05, goodput=40),  # the EPP's own opt-in: not a peer
    ]
    result.policies.append("epp[last-routed]")
    by_name = {r.name: r for r in report.ratios(result)}
    assert by_name["EPP / round robin, TTFT p90"].holds is True  # 0.25 <= 0.5
    assert by_name["EPP / least outstanding, TTFT p90"].holds is False  # 1.0 > 0.8
    assert by_name["EPP / upstream v1.5 default profile, TTFT p90"].holds is True
    assert by_name["EPP / oracle, TTFT p90"].holds is True
    goodput = by_name["EPP / best peer, goodput"]  # the oracle's 31 is the best peer
    assert (goodput.against, goodput.holds) == ("oracle", False)


def test_a_mixed_priority_run_reports_each_priority_and_others_none() -> None:
    result = BenchResult(BenchConfig(loads=(1.2,), repeats=1, workload_name="mixed-priority", mode="virtual"))
    result.policies = ["epp", "round-robin"]
    shed = {"1": {"ttft_p90": 0.02, "shed_rate": 0.0}, "-1": {"ttft_p90": 0.05, "shed_rate": 0.25}}
    blind = {"1": {"ttft_p90": 0.9, "shed_rate": 0.0}, "-1": {"ttft_p90": 0.9, "shed_rate": 0.0}}
    result.runs = [
        dataclasses.replace(run("epp", 0.1), load=1.2, by_priority=shed),
        dataclasses.replace(run("round-robin", 0.9), load=1.2, by_priority=blind),
    ]
    lines = report.by_priority_table(result)
    assert lines[0] == "| load | policy | priority 1: TTFT p90, shed | priority -1: TTFT p90, shed |"
    assert lines[2:] == [
        "| 1.2 | epp | 20 ms, 0.0% | 50 ms, 25.0% |",
        "| 1.2 | round-robin | 900 ms, 0.0% | 900 ms, 0.0% |",
    ]
    assert "By objective priority" in report.markdown(result)
    result.runs = [run("epp", 0.1)]  # one priority only: no table
    assert report.by_priority_table(result) == []


@pytest.mark.parametrize(
    ("value", "holds", "shown"),
    [(0.997, False, "0.997"), (1.003, True, "1.003"), (1.49, True, "1.49"), (0.2, False, "0.20")],
)
def test_a_ratio_next_to_its_bound_shows_the_digit_that_decides(
    value: float, holds: bool, shown: str
) -> None:
    """A goodput 0.3% short of its target read "1.00 ... MISSED" in the committed prefix-heavy report."""
    ratio = report._ratio("EPP / best peer, goodput", value, 1.0, "round-robin", report.AT_LEAST, 1.0)
    assert ratio.holds is holds
    assert f": {shown} against round-robin (target >= 1.0: {'holds' if holds else 'MISSED'})" in ratio.line()
