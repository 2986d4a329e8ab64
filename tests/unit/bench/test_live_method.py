"""The live bench's method: warm traces (the first 10% left out), capacity by least outstanding
requests, and today's other EPPs as named peers in the report."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from harness.cli.bench import report
from harness.cli.bench.cli import live_workload_name
from harness.cli.bench.loadgen import Outcome
from harness.cli.bench.policies import LeastOutstandingPolicy, PoolView, epp_peer_name, epp_variant
from harness.cli.bench.runner import (
    DEFAULT_SIM,
    BenchConfig,
    BenchResult,
    default_workload,
    measured_part,
    warm_count,
)
from harness.cli.bench.stats import RunResult
from harness.cli.bench.workload import TraceRequest
from harness.dataplane.envoy import EnvoyOptions


def request(index: int, at: float) -> TraceRequest:
    return TraceRequest(index, at, "base", "Critical", ("hello",), 1, 4)


def test_the_first_tenth_of_a_trace_is_left_out_and_the_span_starts_at_the_first_kept_arrival() -> None:
    requests = [request(i, at=i * 0.5) for i in range(20)]  # simulated seconds
    outcomes = [Outcome(i, status=200) for i in range(20)]
    config = BenchConfig(sim=replace(BenchConfig().sim, time_scale=2.0))
    measured = measured_part(requests, outcomes, span_wall_s=30.0, config=config)
    assert [o.index for o in measured.outcomes] == list(range(2, 20))
    assert measured.span_wall_s == pytest.approx(30.0 - 1.0 * 2.0)  # request 2 arrives at 1.0 s, 2 wall s
    assert measured.arrivals == [i * 0.5 for i in range(2, 20)]


def test_without_a_warm_up_share_everything_counts() -> None:
    requests = [request(i, at=float(i)) for i in range(5)]
    outcomes = [Outcome(i, status=200) for i in range(5)]
    measured = measured_part(requests, outcomes, 7.0, BenchConfig(warmup_fraction=0.0))
    assert (len(measured.outcomes), measured.span_wall_s, len(measured.arrivals)) == (5, 7.0, 5)


@pytest.mark.parametrize(
    ("requests", "fraction", "left_out"),
    [(600, 0.1, 60), (80, 0.1, 8), (5, 0.1, 1), (1, 0.1, 0), (10, 0.0, 0)],
)
def test_how_many_requests_warm_up(requests: int, fraction: float, left_out: int) -> None:
    assert warm_count(requests, fraction) == left_out


@dataclass
class FakeSim:
    base_url: str


def probe(pods: int) -> LeastOutstandingPolicy:
    sims = [FakeSim(f"http://127.0.0.{i + 1}:8000") for i in range(pods)]
    policy = LeastOutstandingPolicy()
    policy.start(PoolView(sims, "ns", "pool", Path("kubeconfig")))  # type: ignore[arg-type]
    return policy


def test_the_capacity_probe_sends_each_request_to_the_pod_with_the_fewest_outstanding() -> None:
    policy = probe(3)
    route = lambda i: asyncio.run(policy.route(request(i, 0.0)))  # noqa: E731
    first = [route(i) for i in range(3)]
    assert len({t.url for t in first}) == 3, "one each before any pod gets a second"
    policy.finished(first[1])
    assert route(3).url == first[1].url, "the only pod with nothing outstanding"
    policy.finished(first[2])
    policy.finished(first[0])
    assert {route(i).url for i in (4, 5)} == {first[0].url, first[2].url}, "the two emptied pods"
    assert all(t.model == "base" for t in first), "straight to the pods: the served model"


def run(policy: str, ttft_p90: float, goodput: float) -> RunResult:
    figures = {"p50": ttft_p90, "p90": ttft_p90, "p99": ttft_p90}
    return RunResult(
        policy=policy, load=0.9, repeat=0, requests=10, ok=10, shed=0, errors=0,
        ttft=figures, itl=figures, e2e=figures,
        throughput_rps=goodput, output_tps=0.0, goodput_rps=goodput, imbalance=1.0, per_pod=[5, 5],
        wall_s=1.0, lag=0.0,
    )  # fmt: skip


def test_each_other_epp_gets_its_own_ratios_named_and_labelled_with_the_workload() -> None:
    config = BenchConfig(epp_peers=("gie-v1.5.0", "llm-d-router=/opt/epp --flag"), workload_name="sharegpt")
    result = BenchResult(config, capacity_rps=10.0, policies=["epp", "gie-v1.5.0", "llm-d-router"])
    result.runs = [run("epp", 0.05, 9.0), run("gie-v1.5.0", 0.10, 8.0), run("llm-d-router", 0.04, 9.5)]
    lines = {r.name: r for r in report.ratios(result)}
    gie, llmd = lines["EPP / gie-v1.5.0, TTFT p90"], lines["EPP / llm-d-router, TTFT p90"]
    assert (gie.value, gie.holds, gie.workload) == (pytest.approx(0.5), True, "sharegpt")
    assert (llmd.value, llmd.holds) == (pytest.approx(1.25), False)
    assert lines["EPP / llm-d-router, goodput"].holds is False
    assert lines["EPP / gie-v1.5.0, goodput"].value == pytest.approx(9.0 / 8.0)
    assert "on the sharegpt workload" in gie.line()


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("gie-v1.5.0", "gie-v1.5.0"),
        ("v1.5.0", "gie-v1.5.0"),
        ("1.5.0", "gie-v1.5.0"),
        ("llm-d=/x/epp", "llm-d"),
    ],
)
def test_epp_peer_specs_name_their_policy(spec: str, name: str) -> None:
    assert epp_peer_name(spec) == name


def test_the_live_workload_is_named_with_the_adapters_most_of_its_requests_go_to() -> None:
    """The live default is mostly adapter traffic over few slots: no ratio may read as base-model only."""
    mixed = live_workload_name("sharegpt", "poisson", default_workload(), DEFAULT_SIM)
    assert mixed == "sharegpt + 4 adapters over 2 slots (80% of requests)"
    base_only = replace(default_workload(), base_share=1.0)
    assert live_workload_name("sharegpt", "poisson", base_only, DEFAULT_SIM) == "sharegpt"
    assert live_workload_name("sharegpt", "gamma", base_only, DEFAULT_SIM) == "sharegpt, gamma arrivals"


def test_the_v1_gateway_variant_is_the_default_epp_behind_upstreams_v1_envoy() -> None:
    """Its response bodies reach the EPP (so the predicted-TTFT scorer decides); its flags are the
    run's own, with no scheduler or weight of the variant's."""
    policy = epp_variant("v1-gateway", ["--refresh-metrics-interval=100ms"])
    assert policy.name == "epp[v1-gateway]"
    assert policy.envoy == EnvoyOptions.v1()
    assert policy.envoy.response_body_mode == "FULL_DUPLEX_STREAMED"
    assert list(policy.epp_args) == ["--refresh-metrics-interval=100ms"]
    assert policy.epp_env == {}
    assert epp_variant("no-prefix").envoy == EnvoyOptions(), "other variants keep the default gateway"
    with pytest.raises(ValueError, match="v1-gateway"):
        epp_variant("v2-gateway")
