"""The virtual-time cluster: every request is served by the engine its router chose, the EPP's own
accounting and scrapes behave as in the running EPP, and the command writes its report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from epp.api.types import EndpointKey
from epp.config import LAST_ROUTED_OPT_IN_WEIGHT
from harness.cli.bench import cli, report
from harness.cli.bench.virtual.cluster import ClusterConfig, Record, VirtualCluster
from harness.cli.bench.virtual.routers import (
    ALL,
    EppRouter,
    make_router,
    upstream_default_config,
)
from harness.cli.bench.virtual.runner import VirtualConfig, run_virtual
from harness.cli.bench.workload import TraceRequest, WorkloadSpec, generate
from harness.cli.bench.workloads import LORA, MIXED_PRIORITY, PREFIX_HEAVY, named_workload
from harness.sim import EngineState, h100_llama_8b

ROOT = Path(__file__).resolve().parents[3]
SIM = h100_llama_8b(time_scale=0.0, max_num_seqs=16, num_gpu_blocks=2048)


def trace(requests: int = 300, rate: float = 150.0, **changes: object) -> tuple[TraceRequest, ...]:
    spec = named_workload("sharegpt", SIM.model).spec
    return generate(
        WorkloadSpec(**{**spec.__dict__, "requests": requests, "rate": rate, "seed": 3, **changes})
    ).requests


class Spy(EppRouter):
    """The EPP router, recording each scrape's age at the next routing decision."""

    def __init__(self) -> None:
        super().__init__("epp")
        self.scrapes: dict[int, float] = {}
        self.ages: list[float] = []
        self.in_flight: list[int] = []
        self.prefilling: list[int] = []  # the pod's prompt tokens still prefilling, after a first token

    def first_token(self, pod: int, handle: object, now: float) -> object:
        handle = super().first_token(pod, handle, now)
        assert self._host is not None
        found = self._host._store.pod_get(EndpointKey("bench", f"pod-{pod}"))
        assert found is not None
        assert found.dispatched.prefilled_at == now
        self.prefilling.append(found.dispatched.prefill_tokens)
        return handle

    def scraped(self, pod: int, state: EngineState, now: float) -> None:
        self.scrapes[pod] = now
        super().scraped(pod, state, now)

    def route(self, request: TraceRequest, hashes: object, now: float) -> tuple[int, object]:
        if len(self.scrapes) == 4:
            self.ages.append(now - min(self.scrapes.values()))
        return super().route(request, hashes, now)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "policy",
    ["epp", "epp[last-routed]", "upstream-v1.5-default", "oracle", "least-outstanding", "round-robin"],
)
def test_every_request_is_served_where_it_was_routed(policy: str) -> None:
    cluster = VirtualCluster(ClusterConfig(4, SIM))
    records = cluster.run(trace(), make_router(policy))
    assert all(isinstance(r, Record) and not r.shed for r in records)
    for r in records:
        assert r.run is not None
        assert r.run.generated == r.request.max_tokens
        assert r.first_token is not None
        assert r.finished is not None
        assert r.request.at <= r.first_token <= r.finished
    assert sum(1 for r in records if r.pod >= 0) == len(records)
    assert all(e.idle for e in cluster.engines)


def test_scrapes_are_at_most_one_interval_old_and_in_flight_counts_return_to_zero() -> None:
    spy = Spy()
    cluster = VirtualCluster(ClusterConfig(4, SIM))
    cluster.run(trace(), spy)
    assert spy.ages, "no decision saw every pod scraped"
    assert max(spy.ages) <= cluster.config.scrape_interval + 1e-9
    assert min(spy.ages) >= 0
    host = spy._host
    assert host is not None
    pods = host._store.pod_get_all()
    assert [p.dispatched.count for p in pods] == [0, 0, 0, 0]
    assert [(p.dispatched.prompt_tokens, p.dispatched.prefill_tokens) for p in pods] == [(0, 0)] * 4


def test_each_first_token_ends_its_prompts_prefill_in_the_epps_accounting() -> None:
    """The loop tells the EPP of each first token, as the first response chunk does in v1's
    FULL_DUPLEX_STREAMED mode: the pod is stamped, and what it still prefills is other prompts'."""
    spy = Spy()
    requests = trace()
    VirtualCluster(ClusterConfig(4, SIM)).run(requests, spy)
    assert len(spy.prefilling) == len(requests)
    assert 0 in spy.prefilling
    assert max(spy.prefilling) < sum(r.body_bytes for r in requests) // 4


def test_the_epp_sheds_sheddable_requests_only_when_saturated() -> None:
    spec = named_workload(MIXED_PRIORITY, SIM.model).spec
    requests = generate(WorkloadSpec(**{**spec.__dict__, "requests": 400, "rate": 1e6, "seed": 4})).requests
    records = VirtualCluster(ClusterConfig(2, SIM)).run(requests, make_router("epp"))
    shed = [r for r in records if r.shed]
    assert shed, "a burst of 400 on two 16-slot engines must saturate them"
    assert all(r.request.priority < 0 for r in shed)


def test_lora_and_prefix_heavy_workloads_run_on_their_engine_settings() -> None:
    lora = named_workload(LORA, SIM.model)
    assert lora.sim_changes == {"lora_adapters": lora.spec.adapters, "max_loras": 4}
    assert len(lora.spec.adapters) == 16
    heavy = named_workload(PREFIX_HEAVY, SIM.model).spec
    requests = generate(
        WorkloadSpec(**{**heavy.__dict__, "requests": 300, "rate": 100.0, "seed": 5})
    ).requests
    cluster = VirtualCluster(ClusterConfig(4, SIM))
    cluster.run(requests, make_router("epp"))
    hits = sum(e.counters().prefix_hits for e in cluster.engines)
    assert hits > 0  # shared system prompts and histories are found in the engines' caches


def test_the_no_predicted_ttft_variant_is_the_default_profile_without_that_scorer() -> None:
    default = make_router("epp")
    variant = make_router("epp[no-predicted-ttft]")
    assert isinstance(default, EppRouter)
    assert isinstance(variant, EppRouter)
    weights = {s.kind: s.weight for s in default.config.scoring_profile.scorers}
    assert weights["predicted_ttft"] > 0
    assert {s.kind: s.weight for s in variant.config.scoring_profile.scorers} == {
        **weights,
        "predicted_ttft": 0.0,
    }


def test_the_last_routed_variant_is_the_default_profile_plus_the_opt_in_scorer() -> None:
    default = make_router("epp")
    variant = make_router("epp[last-routed]")
    assert isinstance(default, EppRouter)
    assert isinstance(variant, EppRouter)
    weights = {s.kind: s.weight for s in default.config.scoring_profile.scorers}
    assert weights["last_routed"] == 0.0
    assert {s.kind: s.weight for s in variant.config.scoring_profile.scorers} == {
        **weights,
        "last_routed": LAST_ROUTED_OPT_IN_WEIGHT,
    }


def test_the_upstream_profile_is_the_examples_file() -> None:
    profile = upstream_default_config().scoring_profile
    assert [(s.kind, s.weight) for s in profile.scorers] == [
        ("queue", 2.0),
        ("kv_cache", 2.0),
        ("prefix", 3.0),
    ]


def test_the_command_line_selects_the_virtual_mode_and_its_defaults() -> None:
    parser = argparse.ArgumentParser()
    cli.configure_parser(parser)
    config = cli.virtual_config_from(parser.parse_args(["routing", "--virtual", "--workload", "lora"]))
    assert (config.workload, config.pods, config.requests, config.loads, config.repeats) == (
        "lora",
        64,
        20_000,
        (0.9,),
        1,
    )
    assert config.policies == ALL
    with pytest.raises(ValueError, match="unknown virtual policies"):
        cli.virtual_config_from(
            parser.parse_args(["routing", "--virtual", "--policies", "vllm-router:round_robin"])
        )
    with pytest.raises(ValueError, match="needs --virtual"):
        cli.config_from(parser.parse_args(["routing", "--workload", "lora"]))


def test_a_virtual_run_reports_every_policy() -> None:
    config = VirtualConfig(
        pods=2,
        requests=120,
        policies=("epp", "round-robin"),
        sim_changes={"max_num_seqs": 16, "num_gpu_blocks": 2048},
    )
    result = run_virtual(config)
    data = json.loads(json.dumps(report.to_json(result)))  # (the plot is the live bench's e2e test's job)
    assert "| 0.9 | epp |" in report.markdown(result)
    assert data["config"]["mode"] == "virtual"
    assert data["capacity_rps"] > 0
    assert sorted(r["policy"] for r in data["runs"]) == ["epp", "round-robin"]
    assert all(r["ok"] == r["requests"] for r in data["runs"])
    assert all(r["workload"] == "sharegpt" for r in data["ratios"])
    assert any(n.startswith("CPU time") for n in data["notes"])


def test_policies_that_meet_the_slo_for_every_request_tie_on_goodput() -> None:
    """At a light load both policies serve every request within the SLO: their goodput is the rate
    the trace offered, whichever finished its last request first (their throughputs differ)."""
    config = VirtualConfig(
        pods=2,
        requests=120,
        loads=(0.3,),
        policies=("epp", "round-robin"),
        sim_changes={"max_num_seqs": 16, "num_gpu_blocks": 2048},
    )
    result = run_virtual(config)
    epp, round_robin = sorted(result.runs, key=lambda r: r.policy)
    assert (epp.ok, round_robin.ok) == (epp.requests, round_robin.requests)
    assert epp.throughput_rps != round_robin.throughput_rps
    assert epp.goodput_rps == pytest.approx(round_robin.goodput_rps)
    assert epp.goodput_rps == pytest.approx(0.3 * result.capacity_rps, rel=0.15)  # the offered rate
