"""From client outcomes to run figures, and from runs to the report's ratios."""

from __future__ import annotations

import math

import pytest

from harness.cli.bench import report
from harness.cli.bench.loadgen import Outcome
from harness.cli.bench.runner import BenchConfig, BenchResult
from harness.cli.bench.stats import RunResult, Slo, aggregate, goodput, percentile, summarize


def outcome(index: int, ttft: float, e2e: float, tokens: int, status: int = 200) -> Outcome:
    gaps = [(e2e - ttft) / (tokens - 1)] * (tokens - 1) if tokens > 1 else []
    return Outcome(index, status=status, ttft=ttft, e2e=e2e, tokens=tokens, gaps=gaps)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([3, 1, 2], 50, 2, id="median"),
        pytest.param(list(range(1, 11)), 90, 9, id="p90-nearest-rank"),
        pytest.param(list(range(1, 11)), 99, 10, id="p99"),
        pytest.param([5], 90, 5, id="one"),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 90))


def test_summarize_converts_to_simulated_time_and_counts_goodput() -> None:
    outcomes = [
        outcome(0, ttft=0.02, e2e=0.22, tokens=11),  # 10 ms TTFT at scale 2; ITL 10 ms: good
        outcome(1, ttft=2.2, e2e=2.4, tokens=11),  # TTFT 1.1 s: over the 1 s SLO
        outcome(2, ttft=0.02, e2e=2.02, tokens=11),  # ITL 100 ms: over the 50 ms SLO
        Outcome(3, status=429),
        Outcome(4, status=0, error="ClientConnectorError"),
    ]
    arrivals = [0.0, 0.25, 0.5, 0.75, 1.0]  # simulated seconds: 4 requests per second offered
    run = summarize(
        "p",
        0.9,
        0,
        outcomes,
        time_scale=2.0,
        span_wall_s=4.0,
        arrivals=arrivals,
        per_pod=[3, 1, 0, 0],
        slo=Slo(1.0, 0.05),
    )
    assert (run.requests, run.ok, run.shed, run.errors) == (5, 3, 1, 1)
    assert run.ttft["p50"] == pytest.approx(0.01)
    assert run.ttft["p99"] == pytest.approx(1.1)
    assert run.throughput_rps == pytest.approx(3 / 2.0)  # 4 wall seconds = 2 simulated
    assert run.goodput_rps == pytest.approx(1 / 5 * 4.0)  # 1 of 5 within the SLO, at 4 per second
    assert run.output_tps == pytest.approx(33 / 2.0)
    assert run.imbalance == pytest.approx(3.0)  # busiest pod 3 against a mean of 1


def test_how_far_behind_the_engines_ran_is_their_lag_weighted_by_step_time() -> None:
    """`behind` is the pods' summed (lag x step duration) over their summed step time: the mean
    number of simulated seconds an observer saw the engines late; no step time, nothing to say."""
    common = {"time_scale": 3.0, "span_wall_s": 3.0, "arrivals": [0.0, 1.0], "per_pod": [1, 1]}
    behind = summarize("p", 0.9, 0, [], **common, slo=Slo(1.0, 0.05), behind_s=0.004, busy_s=1.6)  # type: ignore[arg-type]
    assert behind.behind == pytest.approx(0.0025)
    idle = summarize("p", 0.9, 0, [], **common, slo=Slo(1.0, 0.05))  # type: ignore[arg-type]
    assert idle.behind == 0.0


def run(policy: str, load: float, p90: float, goodput: float = 10.0, repeat: int = 0) -> RunResult:
    pct = {"p50": p90 / 2, "p90": p90, "p99": p90 * 2}
    return RunResult(policy, load, repeat, 100, 100, 0, 0, pct, pct, pct, 10.0, 100.0, goodput, 1.0)


def test_aggregate_takes_the_median_and_spread_over_repeats() -> None:
    agg = aggregate([run("e", 0.9, p, repeat=i) for i, p in enumerate((0.3, 0.1, 0.2))])
    assert (agg["ttft_p90"].median, agg["ttft_p90"].low, agg["ttft_p90"].high) == (0.2, 0.1, 0.3)


def test_ratios_compare_the_epp_with_round_robin_the_best_peer_and_the_oracle() -> None:
    result = BenchResult(BenchConfig(loads=(0.9,), repeats=1))
    result.policies = [
        "epp",
        "envoy-round-robin",
        "envoy-least-request",
        "oracle",
        "vllm-router:power_of_two",
        "sglang-router:cache_aware",
    ]
    result.runs = [
        run("epp", 0.9, 0.12, goodput=20),
        run("envoy-round-robin", 0.9, 0.4),
        run("envoy-least-request", 0.9, 0.1),
        run("oracle", 0.9, 0.1),
        run("vllm-router:power_of_two", 0.9, 0.2, goodput=21),
        run("sglang-router:cache_aware", 0.9, 0.15, goodput=19),
    ]
    by_name = {r.name: r for r in report.ratios(result)}
    rr = by_name["EPP / round robin, TTFT p90"]
    assert (rr.value, rr.holds) == (pytest.approx(0.3), True)
    peer = by_name["EPP / best peer, TTFT p90"]
    assert (peer.against, peer.value, peer.holds) == ("sglang-router:cache_aware", pytest.approx(0.8), True)
    oracle = by_name["EPP / oracle, TTFT p90"]
    assert (oracle.value, oracle.holds) == (pytest.approx(1.2), True)
    lr = by_name["EPP / Envoy least-request, TTFT p90"]
    assert lr.holds is False
    goodput = by_name["EPP / best peer, goodput"]
    assert (goodput.against, goodput.holds) == ("vllm-router:power_of_two", False)
    assert by_name["EPP / best cache-aware peer, TTFT p90"].against == "sglang-router:cache_aware"
    markdown = report.markdown(result)
    assert "| 0.9 | epp | 60 ms | 120 ms (120 ms-120 ms) |" in markdown


def test_a_ratio_against_a_policy_that_did_not_run_is_not_a_verdict() -> None:
    result = BenchResult(BenchConfig(loads=(0.9,), repeats=1))
    result.policies = ["epp"]
    result.runs = [run("epp", 0.9, 0.1)]
    assert all(r.holds is None for r in report.ratios(result))


def test_goodput_is_the_share_within_the_slo_times_the_offered_rate() -> None:
    arrivals = [0.0, 0.5, 1.0, 1.5, 2.0]  # 2 requests per second
    assert goodput(5, arrivals) == pytest.approx(2.0)
    assert goodput(2, arrivals) == pytest.approx(0.8)
    assert goodput(0, arrivals) == 0.0


def test_how_long_the_last_request_takes_to_finish_does_not_change_goodput() -> None:
    """Two runs that met the SLO for every request tie, however long the trace took to drain (it
    used to be divided by the span to the last finish, and one long decode at the end decided)."""
    outcomes = [outcome(i, ttft=0.02, e2e=0.22, tokens=11) for i in range(4)]
    quick, slow = (
        summarize(
            "p",
            0.9,
            0,
            outcomes,
            time_scale=1.0,
            span_wall_s=span,
            arrivals=[0.0, 1.0, 2.0, 3.0],
            per_pod=[4],
            slo=Slo(1.0, 0.05),
        )
        for span in (3.5, 9.0)
    )
    assert quick.throughput_rps > slow.throughput_rps
    assert quick.goodput_rps == slow.goodput_rps == pytest.approx(1.0)


@pytest.mark.parametrize("arrivals", [[], [1.0], [2.0, 2.0]])
def test_goodput_without_a_rate_to_measure_is_nan(arrivals: list[float]) -> None:
    assert math.isnan(goodput(len(arrivals), arrivals))
