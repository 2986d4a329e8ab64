"""The filter engine and each filter on its own (epp-behaviour.md §5.1, §5.3)."""

from __future__ import annotations

import random

import pytest

from epp.scheduling.filters import (
    FilterFunc,
    FilterNode,
    LLMRequest,
    Pods,
    critical_request,
    has_capacity_for_sheddable,
    least_kv_cache,
    least_queuing,
    lora_soft_affinity,
    low_queueing,
)

from .pods import names, pm

REQ = LLMRequest(model="m", target_model="lora-a", critical=True)


@pytest.mark.parametrize(
    ("queues", "kept"),
    [
        pytest.param([], [], id="empty-input"),
        pytest.param([4], ["p0"], id="single"),
        pytest.param([3, 3, 3], ["p0", "p1", "p2"], id="all-equal"),
        pytest.param([0, 3, 10], ["p0", "p1"], id="band-is-range-over-n"),  # 0 + 10 // 3 = 3
        pytest.param([0, 1], ["p0"], id="integer-division-floors"),  # 0 + 1 // 2 = 0
        pytest.param([10, 0, 2, 9], ["p1", "p2"], id="order-kept"),  # 0 + 10 // 4 = 2
    ],
)
def test_least_queuing(queues: list[int], kept: list[str]) -> None:
    pods = [pm(f"p{i}", queue=q) for i, q in enumerate(queues)]
    assert names(least_queuing(REQ, pods)) == kept


@pytest.mark.parametrize(
    ("usage", "kept"),
    [
        pytest.param([], [], id="empty-input"),
        pytest.param([0.1, 0.4, 0.7], ["p0"], id="band-is-range-over-n"),  # 0.1 + 0.6 / 3 = 0.3
        pytest.param([0.0, 0.5], ["p0"], id="float-division"),  # 0 + 0.5 / 2 = 0.25
        pytest.param([0.2, 0.3, 0.2], ["p0", "p2"], id="ties-kept"),
        pytest.param([0.0, 0.3, 0.9], ["p0", "p1"], id="upper-bound-inclusive"),  # 0 + 0.9 / 3 = 0.3
    ],
)
def test_least_kv_cache(usage: list[float], kept: list[str]) -> None:
    pods = [pm(f"p{i}", kv=u) for i, u in enumerate(usage)]
    assert names(least_kv_cache(REQ, pods)) == kept


@pytest.mark.parametrize(
    ("critical", "kept"),
    [pytest.param(True, ["a", "b"], id="critical-passes-all"), pytest.param(False, [], id="other-fails")],
)
def test_critical_request(critical: bool, kept: list[str]) -> None:
    req = LLMRequest("m", "m", critical)
    assert names(critical_request(req, [pm("a"), pm("b")])) == kept


def test_low_queueing_is_strictly_below_threshold() -> None:
    pods = [pm("under", queue=127), pm("at", queue=128), pm("over", queue=500)]
    assert names(low_queueing(128)(REQ, pods)) == ["under"]


@pytest.mark.parametrize(
    ("queue", "kv", "has_capacity"),
    [
        pytest.param(0, 0.0, True, id="idle"),
        pytest.param(5, 0.8, True, id="both-at-threshold-inclusive"),
        pytest.param(6, 0.0, False, id="queue-over"),
        pytest.param(0, 0.81, False, id="kv-over"),
    ],
)
def test_has_capacity_for_sheddable(queue: int, kv: float, has_capacity: bool) -> None:
    out = has_capacity_for_sheddable(5, 0.8)(REQ, [pm("p", queue=queue, kv=kv)])
    assert bool(out) is has_capacity


AFFINITY = pm("affinity", active=["lora-a"], max_lora=1)
WAITING_AFFINITY = pm("waiting-affinity", waiting=["lora-a"], max_lora=1)
AVAILABLE = pm("available", active=["lora-b"], max_lora=2)
FULL = pm("full", active=["lora-b", "lora-c"], max_lora=2)
NO_LORA = pm("no-lora")  # max_lora 0: cannot load adapters at all


@pytest.mark.parametrize(
    ("pods", "threshold", "kept"),
    [
        pytest.param([AFFINITY, AVAILABLE], 1.0, ["affinity"], id="both-affinity-chosen"),
        pytest.param([AFFINITY, AVAILABLE], 0.0, ["available"], id="both-available-chosen"),
        pytest.param([AFFINITY, FULL], 0.0, ["affinity"], id="only-affinity"),
        pytest.param([AVAILABLE, FULL], 1.0, ["available"], id="only-available"),
        pytest.param([FULL, NO_LORA], 1.0, [], id="neither-fails"),
        pytest.param([WAITING_AFFINITY, FULL], 1.0, ["waiting-affinity"], id="waiting-adapter-is-affinity"),
        pytest.param(
            [pm("loaded-waiting", active=["x"], waiting=["y"], max_lora=2)], 1.0, [], id="waiting-uses-a-slot"
        ),
    ],
)
def test_lora_soft_affinity(pods: Pods, threshold: float, kept: list[str]) -> None:
    assert names(lora_soft_affinity(threshold, random.Random(1))(REQ, pods)) == kept


def test_lora_soft_affinity_split_is_statistical() -> None:
    """With both groups present, affinity wins with probability `threshold` (seeded, wide bounds)."""
    rng = random.Random(42)
    soft = lora_soft_affinity(0.8, rng)
    trials = 10_000
    hits = sum(soft(REQ, [AFFINITY, AVAILABLE]) == [AFFINITY] for _ in range(trials))
    assert 0.77 * trials < hits < 0.83 * trials


class FixedDraw(random.Random):
    """Every draw is the same number: the boundary of the split, checked exactly."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def test_a_draw_equal_to_the_threshold_spreads() -> None:
    """Affinity when the draw is below the threshold (upstream: `rand.Float64() < threshold`), so a
    threshold of 0 never keeps affinity and the draw at exactly the threshold goes to `available`."""
    assert lora_soft_affinity(0.5, FixedDraw(0.5))(REQ, [AFFINITY, AVAILABLE]) == [AVAILABLE]
    assert lora_soft_affinity(0.5, FixedDraw(0.4999))(REQ, [AFFINITY, AVAILABLE]) == [AFFINITY]
    assert lora_soft_affinity(0.0, FixedDraw(0.0))(REQ, [AFFINITY, AVAILABLE]) == [AVAILABLE]


def test_default_affinity_threshold_rarely_spreads() -> None:
    rng = random.Random(7)
    soft = lora_soft_affinity(0.999, rng)
    spread = sum(soft(REQ, [AFFINITY, AVAILABLE]) == [AVAILABLE] for _ in range(20_000))
    assert 0 < spread < 60  # expected 20


# --- the engine ---------------------------------------------------------------------------------
def keep(*wanted: str) -> FilterFunc:
    def func(_: LLMRequest, pods: Pods) -> Pods:
        return [p for p in pods if p.pod.key.name in wanted]

    return func


def recorder(seen: list[list[str]]) -> FilterNode:
    def func(_: LLMRequest, pods: Pods) -> Pods:
        seen.append(names(pods))
        return pods

    return FilterNode(func)


PODS = [pm("a"), pm("b"), pm("c")]


def test_engine_success_passes_the_output_on() -> None:
    seen: list[list[str]] = []
    node = FilterNode(keep("a"), on_success=recorder(seen), on_failure=recorder([]))
    assert names(node.run(REQ, PODS)) == ["a"]
    assert seen == [["a"]]


def test_engine_failure_passes_the_original_input_on() -> None:
    seen: list[list[str]] = []
    node = FilterNode(keep(), on_success=recorder([]), on_failure=recorder(seen))
    assert names(node.run(REQ, PODS)) == ["a", "b", "c"]
    assert seen == [["a", "b", "c"]]


@pytest.mark.parametrize(
    ("wanted", "seen_input"),
    [
        pytest.param(("b",), ["b"], id="success-goes-to-either-branch"),
        pytest.param((), ["a", "b", "c"], id="failure-goes-to-either-branch-with-original"),
    ],
)
def test_engine_success_or_failure_branch(wanted: tuple[str, ...], seen_input: list[str]) -> None:
    seen: list[list[str]] = []
    FilterNode(keep(*wanted), on_success_or_failure=recorder(seen)).run(REQ, PODS)
    assert seen == [seen_input]


def test_engine_specific_branch_beats_either_branch() -> None:
    seen: list[list[str]] = []
    node = FilterNode(keep("a"), on_success=recorder(seen), on_success_or_failure=recorder([]))
    node.run(REQ, PODS)
    assert seen == [["a"]]


def test_engine_failure_without_next_returns_empty() -> None:
    assert FilterNode(keep(), on_success=recorder([])).run(REQ, PODS) == []
