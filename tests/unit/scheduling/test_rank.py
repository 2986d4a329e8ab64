"""`rank`: the pick first, then fallbacks from the same decision (the v1 destination comma list).

Both schedulers: the first pod is always what `schedule` returns with the same seed; the fallbacks
are the next best of the same scoring (scorer) or the tree's pick once the better ones are gone
(filter tree); never a stale pod while a fresh one exists; never more than `limit`.
"""

from __future__ import annotations

import random

import pytest

from epp.config import FILTER_TREE, SCORER, SchedulerConfig, ScorerWeights
from epp.datastore.types import PodMetrics
from epp.errors import NoEndpoints, ResourceExhausted
from epp.scheduling import LLMRequest, Scheduler, ScorerScheduler, new_scheduler

from .pods import NOW, names, pm

CRITICAL = LLMRequest("m", "lora-a", critical=True)
SHEDDABLE = LLMRequest("m", "lora-a", critical=False)
QUEUE_ONLY = SchedulerConfig(
    kind=SCORER, weights=ScorerWeights(queue=1.0, kv_cache=0.0, prefix=0.0, lora=0.0, in_flight=0.0)
)
# Affinity always wins when both groups exist, so tree outcomes are deterministic.
STRICT_TREE = SchedulerConfig(kind=FILTER_TREE, lora_affinity_threshold=1.0)


def scorer(config: SchedulerConfig = QUEUE_ONLY, seed: int = 1) -> ScorerScheduler:
    return ScorerScheduler(config, random.Random(seed), clock=lambda: NOW)


def tree(config: SchedulerConfig = STRICT_TREE, seed: int = 1) -> Scheduler:
    return Scheduler(config, random.Random(seed), clock=lambda: NOW)


@pytest.mark.parametrize(
    ("pods", "limit", "expected"),
    [
        pytest.param(
            [pm("q5", queue=5), pm("q0", queue=0), pm("q9", queue=9), pm("q3", queue=3)],
            3,
            ["q0", "q3", "q5"],
            id="best-total-then-next-best",
        ),
        pytest.param([pm("q5", queue=5), pm("q0", queue=0)], 3, ["q0", "q5"], id="fewer-pods-than-the-limit"),
        pytest.param([pm("q5", queue=5), pm("q0", queue=0)], 1, ["q0"], id="limit-one-is-the-pick-alone"),
        pytest.param([pm("q5", queue=5), pm("q0", queue=0)], 0, ["q0"], id="limit-zero-still-picks"),
        pytest.param(
            [pm("q0", queue=0), pm("b", queue=4), pm("a", queue=4), pm("c", queue=4)],
            3,
            ["q0", "b", "a"],
            id="equal-fallbacks-keep-the-given-order",
        ),
        pytest.param(
            [pm("stale-idle", updated_at=NOW - 60), pm("q7", queue=7), pm("q1", queue=1)],
            3,
            ["q1", "q7"],
            id="a-stale-pod-is-never-a-fallback-beside-fresh-ones",
        ),
    ],
)
def test_scorer_ranks_by_total(pods: list[PodMetrics], limit: int, expected: list[str]) -> None:
    assert names(scorer().rank(CRITICAL, pods, limit)) == expected


@pytest.mark.parametrize(
    ("request_", "pods", "expected"),
    [
        pytest.param(
            CRITICAL,
            [pm("q0", queue=0, kv=0.9), pm("q1", queue=1, kv=0.1), pm("q9", queue=9)],
            # alone: queue band 0..3 keeps q0, q1, KV keeps q1; without q1: band 0..4 keeps q0; then q9
            ["q1", "q0", "q9"],
            id="each-fallback-is-the-trees-pick-without-the-better-ones",
        ),
        pytest.param(
            SHEDDABLE,
            [pm("room", queue=5, kv=0.8), pm("full", queue=6, kv=0.1), pm("room2", queue=2, kv=0.8)],
            # a pod without capacity for a sheddable request is never a fallback: that run sheds
            ["room2", "room"],
            id="sheddable-fallbacks-stop-where-capacity-ends",
        ),
        pytest.param(
            CRITICAL,
            [pm("q5", queue=5), pm("q0", queue=0)],
            # every pod ranked before the limit is reached: the list ends there, it is not lost
            ["q0", "q5"],
            id="fewer-pods-than-the-limit",
        ),
    ],
)
def test_tree_ranks_by_rerunning_the_tree(
    request_: LLMRequest, pods: list[PodMetrics], expected: list[str]
) -> None:
    assert names(tree().rank(request_, pods, 3)) == expected


@pytest.mark.parametrize("kind", [SCORER, FILTER_TREE])
def test_the_first_pod_is_what_schedule_picks_with_the_same_seed(kind: str) -> None:
    pods = [pm(f"p{i}", queue=i % 3, kv=0.1 * (i % 4), max_lora=2) for i in range(12)]
    config = SchedulerConfig(kind=kind)
    for seed in range(30):
        picked = new_scheduler(config, random.Random(seed), lambda: NOW).schedule(CRITICAL, pods)
        ranked = new_scheduler(config, random.Random(seed), lambda: NOW).rank(CRITICAL, pods, 3)
        assert ranked[0] is picked
        assert len(ranked) == 3
        assert len({id(p) for p in ranked}) == 3, "no pod twice"


@pytest.mark.parametrize("kind", [SCORER, FILTER_TREE])
def test_no_fresh_pod_critical_gets_the_others_as_fallbacks(kind: str) -> None:
    pods = [pm("a", updated_at=None), pm("b", updated_at=NOW - 9), pm("c", updated_at=None)]
    ranked = new_scheduler(SchedulerConfig(kind=kind), random.Random(4), lambda: NOW).rank(CRITICAL, pods, 2)
    assert len(ranked) == 2
    first = ranked[0].pod.key.name
    assert names(ranked[1:]) == [n for n in ("a", "b", "c") if n != first][:1]


@pytest.mark.parametrize("kind", [SCORER, FILTER_TREE])
def test_rank_raises_as_schedule_does(kind: str) -> None:
    sched = new_scheduler(SchedulerConfig(kind=kind), random.Random(0), lambda: NOW)
    with pytest.raises(NoEndpoints):
        sched.rank(CRITICAL, [], 3)
    with pytest.raises(ResourceExhausted):
        sched.rank(SHEDDABLE, [pm("full", queue=50)], 3)
    with pytest.raises(ResourceExhausted, match="fresh metrics"):
        sched.rank(SHEDDABLE, [pm("stale", updated_at=None)], 3)
