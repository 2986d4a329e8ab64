"""The v0.3.0 decision tree end to end, shedding, no endpoints, staleness and the final draw."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from epp.config import SchedulerConfig
from epp.errors import NoEndpoints, ResourceExhausted
from epp.scheduling import LLMRequest, Scheduler, build_tree, new_scheduler
from epp.scheduling.filters import Pods

from .pods import NOW, names, pm

# Affinity always wins when both groups exist, so tree outcomes are deterministic.
STRICT = SchedulerConfig(lora_affinity_threshold=1.0)
CRITICAL = LLMRequest(model="m", target_model="lora-a", critical=True)
SHEDDABLE = LLMRequest(model="m", target_model="lora-a", critical=False)


@pytest.mark.parametrize(
    ("request_", "pods", "survivors"),
    [
        pytest.param(
            CRITICAL,
            [pm("affinity", queue=3, active=["lora-a"], max_lora=1), pm("idle", max_lora=4)],
            ["affinity"],
            id="critical-low-queue-affinity-beats-idle-pod",
        ),
        pytest.param(
            CRITICAL,
            [pm("slot-free", queue=10, max_lora=2), pm("full", queue=0, active=["x"], max_lora=1)],
            ["slot-free"],
            id="critical-low-queue-no-affinity-takes-pod-with-free-slot",
        ),
        pytest.param(
            CRITICAL,
            [pm("q0", queue=0, kv=0.9), pm("q1", queue=1, kv=0.1), pm("q9", queue=9)],
            # queue band 0 + 9 // 3 = 3 keeps q0, q1; KV band 0.1 + 0.8 / 2 = 0.5 keeps q1
            ["q1"],
            id="critical-no-lora-anywhere-falls-to-least-queue-then-kv",
        ),
        pytest.param(
            CRITICAL,
            [pm("busy", queue=200), pm("less-busy", queue=130), pm("ok", queue=127, kv=0.99)],
            ["ok"],
            id="critical-low-queue-keeps-only-pods-under-128",
        ),
        pytest.param(
            CRITICAL,
            [
                pm("a", queue=300, active=["lora-a"], max_lora=1),
                pm("b", queue=200, max_lora=2),
                pm("c", queue=210, active=["lora-a"], max_lora=1),
            ],
            # queue band 200 + 100 // 3 = 233 keeps b, c; then affinity picks c over b
            ["c"],
            id="critical-all-queues-high-least-queue-then-affinity",
        ),
        pytest.param(
            CRITICAL,
            [pm("a", queue=500, kv=0.95), pm("b", queue=500, kv=0.99)],
            ["a"],
            id="critical-never-dropped-even-when-everything-is-full",
        ),
        pytest.param(
            SHEDDABLE,
            [pm("room", queue=5, kv=0.8), pm("full", queue=6, kv=0.1)],
            ["room"],
            id="sheddable-capacity-thresholds-inclusive",
        ),
        pytest.param(
            SHEDDABLE,
            [
                pm("room-affinity", queue=4, kv=0.5, active=["lora-a"], max_lora=1),
                pm("room-idle", queue=0, kv=0.0, max_lora=2),
                pm("no-room", queue=50),
            ],
            ["room-idle"],
            id="sheddable-capacity-then-least-queue-before-affinity",  # band 0 + 4 // 2 = 2
        ),
        pytest.param(
            SHEDDABLE,
            [
                pm("a", queue=1, kv=0.1, active=["lora-a"], max_lora=1),
                pm("b", queue=1, kv=0.7, max_lora=2),
            ],
            ["a"],
            id="sheddable-capacity-affinity-among-equal-queues",
        ),
    ],
)
def test_tree_branches(request_: LLMRequest, pods: Pods, survivors: list[str]) -> None:
    tree = build_tree(STRICT, random.Random(0))
    assert sorted(names(tree.run(request_, pods))) == sorted(survivors)


@pytest.mark.parametrize(
    "pods",
    [
        pytest.param([pm("q", queue=6)], id="queue-over-threshold"),
        pytest.param([pm("kv", kv=0.81)], id="kv-over-threshold"),
        pytest.param([pm("q", queue=6), pm("kv", kv=0.9)], id="every-pod-lacks-one"),
    ],
)
def test_sheddable_without_capacity_is_shed_with_429(pods: Pods) -> None:
    scheduler = Scheduler(STRICT, random.Random(0), clock=lambda: NOW)
    with pytest.raises(ResourceExhausted, match="dropping request due to limited backend resources") as info:
        scheduler.schedule(SHEDDABLE, pods)
    assert info.value.http_status == 429


def test_thresholds_come_from_config() -> None:
    config = SchedulerConfig(queue_threshold_critical=0, kv_cache_threshold=0.5)
    scheduler = Scheduler(config, random.Random(0), clock=lambda: NOW)
    assert scheduler.schedule(SHEDDABLE, [pm("a", queue=0, kv=0.5)]).pod.key.name == "a"
    with pytest.raises(ResourceExhausted):
        scheduler.schedule(SHEDDABLE, [pm("a", queue=1, kv=0.0)])


@pytest.mark.parametrize("request_", [CRITICAL, SHEDDABLE], ids=["critical", "sheddable"])
def test_no_pods_is_503(request_: LLMRequest) -> None:
    scheduler = Scheduler(STRICT, clock=lambda: NOW, pool_name="default/pool")
    with pytest.raises(NoEndpoints, match="no ready endpoints in pool default/pool") as info:
        scheduler.schedule(request_, [])
    assert info.value.http_status == 503


@pytest.mark.parametrize("request_", [CRITICAL, SHEDDABLE], ids=["critical", "sheddable"])
def test_fresh_pod_preferred_over_stale_idle_pod(request_: LLMRequest) -> None:
    """A stale or never-scraped pod reports zeros; it must not win over a fresh pod (upstream #336)."""
    pods = [
        pm("fresh", queue=3, kv=0.5),
        pm("stale", queue=0, kv=0.0, updated_at=NOW - 2.5),
        pm("never-scraped", updated_at=None),
    ]
    scheduler = Scheduler(SchedulerConfig(), random.Random(3), clock=lambda: NOW)
    picks = {scheduler.schedule(request_, pods).pod.key.name for _ in range(200)}
    assert picks == {"fresh"}


def test_sheddable_is_shed_when_fresh_pods_are_full_even_if_a_stale_one_looks_idle() -> None:
    pods = [pm("fresh-full", queue=50), pm("stale-idle", updated_at=NOW - 10)]
    scheduler = Scheduler(SchedulerConfig(), random.Random(0), clock=lambda: NOW)
    with pytest.raises(ResourceExhausted, match="limited backend resources"):
        scheduler.schedule(SHEDDABLE, pods)


def test_metrics_exactly_at_the_threshold_are_fresh() -> None:
    pods = [pm("edge", queue=9, updated_at=NOW - 2.0), pm("stale", updated_at=NOW - 2.001)]
    config = SchedulerConfig(metrics_staleness_threshold=2.0)
    scheduler = Scheduler(config, random.Random(0), clock=lambda: NOW)
    assert scheduler.schedule(CRITICAL, pods).pod.key.name == "edge"


def test_only_stale_pods_critical_is_routed_uniformly() -> None:
    pods = [pm("stale-busy", queue=400, updated_at=NOW - 5), pm("never-scraped", updated_at=None)]
    scheduler = Scheduler(SchedulerConfig(), random.Random(11), clock=lambda: NOW)
    counts = Counter(scheduler.schedule(CRITICAL, pods).pod.key.name for _ in range(2000))
    assert set(counts) == {"stale-busy", "never-scraped"}
    assert 800 < counts["stale-busy"] < 1200


def test_only_stale_pods_sheddable_is_shed_with_reason() -> None:
    pods = [pm("stale", updated_at=NOW - 5), pm("never-scraped", updated_at=None)]
    scheduler = Scheduler(SchedulerConfig(), random.Random(0), clock=lambda: NOW)
    with pytest.raises(ResourceExhausted, match="no pod has fresh metrics") as info:
        scheduler.schedule(SHEDDABLE, pods)
    assert info.value.http_status == 429


def test_final_pick_is_uniform_among_survivors() -> None:
    pods = [pm(f"p{i}", queue=1, kv=0.2) for i in range(4)]
    scheduler = Scheduler(SchedulerConfig(), random.Random(5), clock=lambda: NOW)
    counts = Counter(scheduler.schedule(SHEDDABLE, pods).pod.key.name for _ in range(8000))
    assert set(counts) == {"p0", "p1", "p2", "p3"}
    assert all(1700 < c < 2300 for c in counts.values()), counts


def test_schedule_draws_once_from_the_rng_per_request() -> None:
    # Four equal pods all survive the tree: each request is one uniform draw, nothing more (a
    # schedule that ranked fallbacks too would draw again and shift every later decision).
    pods = [pm(f"p{i}") for i in range(4)]
    scheduler = Scheduler(SchedulerConfig(), random.Random(9), clock=lambda: NOW)
    reference = random.Random(9)
    assert [scheduler.schedule(CRITICAL, pods) for _ in range(20)] == [
        reference.choice(pods) for _ in range(20)
    ]


def test_same_seed_same_decisions() -> None:
    pods = [pm(f"p{i}", queue=i % 2, kv=0.1 * (i % 3), max_lora=2) for i in range(10)]
    first = Scheduler(SchedulerConfig(), random.Random(9), clock=lambda: NOW)
    second = Scheduler(SchedulerConfig(), random.Random(9), clock=lambda: NOW)
    a = [first.schedule(CRITICAL, pods).pod.key for _ in range(50)]
    b = [second.schedule(CRITICAL, pods).pod.key for _ in range(50)]
    assert a == b


@pytest.mark.parametrize("kind", ["filter-tree", "scorer"])
def test_a_scheduler_built_without_an_rng_draws_from_its_own(kind: str) -> None:
    """`new_scheduler`'s RNG is optional: without one the draw still works, and spreads (two equal
    pods both get picked)."""
    scheduler = new_scheduler(SchedulerConfig(kind=kind), clock=lambda: NOW)
    twins = [pm("a"), pm("b")]
    picked = {scheduler.schedule(CRITICAL, twins).pod.key.name for _ in range(200)}
    assert picked == {"a", "b"}
