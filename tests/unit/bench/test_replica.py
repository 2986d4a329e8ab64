"""The virtual twin of a live run: the live traces, the live rates, each policy in its live role."""

from __future__ import annotations

import pytest

from harness.cli.bench.runner import BenchConfig, BenchResult, trace_spec, warm_count
from harness.cli.bench.virtual.replica import replay_in_virtual_time
from harness.cli.bench.workload import generate

CAPACITY = 200.0


def live_result(**changes: object) -> BenchResult:
    config = BenchConfig(pods=2, requests=40, loads=(0.5, 0.9), repeats=2, **changes)  # type: ignore[arg-type]
    policies = ["epp", "envoy-round-robin", "envoy-least-request", "vllm-router:round_robin"]
    return BenchResult(config, capacity_rps=CAPACITY, policies=policies)


def test_every_policy_with_a_twin_runs_every_load_and_repeat_of_the_live_run() -> None:
    twin = replay_in_virtual_time(live_result())
    assert twin.policies == ["epp", "envoy-round-robin", "envoy-least-request"]  # no twin for a peer router
    assert twin.config.mode == "virtual"
    assert twin.capacity_rps == CAPACITY
    ran = sorted((r.policy, r.load, r.repeat) for r in twin.runs)
    assert ran == sorted((p, load, rep) for p in twin.policies for load in (0.5, 0.9) for rep in (0, 1))
    # The live summary's warm-up share is left out of the twin's figures too.
    assert {r.requests for r in twin.runs} == {40 - warm_count(40, twin.config.warmup_fraction)}


def test_each_trace_is_the_live_one_at_the_live_rate() -> None:
    config = live_result().config
    first, again = (generate(trace_spec(config, CAPACITY, 1, 0)) for _ in range(2))
    assert [r.at for r in first.requests] == [r.at for r in again.requests]
    assert trace_spec(config, CAPACITY, 1, 0).rate == pytest.approx(0.9 * CAPACITY)
    other_repeat = generate(trace_spec(config, CAPACITY, 1, 1))
    assert [r.at for r in other_repeat.requests] != [r.at for r in first.requests]


def test_the_epps_scrapes_keep_their_wall_interval_in_simulated_time() -> None:
    twin = replay_in_virtual_time(live_result(), refresh_interval_wall_s=0.06)
    assert any("every 20.0 simulated ms" in note for note in twin.notes)  # time scale 3


@pytest.mark.parametrize(
    ("changes", "capacity", "message"),
    [
        ({"epp_args": ("--scheduler=filter-tree",)}, CAPACITY, "default scheduler"),
        ({"epp_variants": ("no-prefix",)}, CAPACITY, "default scheduler"),
        ({}, 0.0, "no measured capacity"),
    ],
)
def test_a_run_that_cannot_be_twinned_is_refused(
    changes: dict[str, object], capacity: float, message: str
) -> None:
    live = live_result(**changes)
    live.capacity_rps = capacity
    with pytest.raises(ValueError, match=message):
        replay_in_virtual_time(live)
