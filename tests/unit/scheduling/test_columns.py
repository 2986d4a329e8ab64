"""The scheduler's fast path decides exactly as the straightforward one does.

`ScorerScheduler` sums its scores column-wise (epp.scheduling.columns), picks the freshness of all
pods from the oldest scrape (`fresh_pods`) and selects fallbacks without sorting every pod
(`ranked_rest`). Each is pinned here against a reference written the plain way — one scorer at a
time through `scorers.total_scores`, a freshness test per pod, a full sort — for random pods,
requests, profiles and pickers: the same totals to the last bit, the same pods in the same order,
the same error, and the same draws from the RNG.
"""

from __future__ import annotations

import dataclasses
import math
import random
import struct
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.api.types import EndpointKey
from epp.config import (
    IN_FLIGHT_SCORER,
    KV_CACHE_SCORER,
    LORA_SCORER,
    PICKERS,
    PREFIX_SCORER,
    QUEUE_SCORER,
    SCORER,
    SCORER_KINDS,
    SchedulerConfig,
    ScoringProfile,
    WeightedScorer,
)
from epp.datastore.types import Dispatched, Metrics, Pod, PodMetrics
from epp.errors import EppError, NoEndpoints, ResourceExhausted
from epp.scheduling import LLMRequest, ScorerScheduler
from epp.scheduling.columns import CompiledProfile
from epp.scheduling.scheduler import DROP_MESSAGE, fresh_pods
from epp.scheduling.scorers import PICKERS as PICKER_FUNCS
from epp.scheduling.scorers import pick_random, ranked_rest, total_scores

from .pods import NOW

THRESHOLD = SchedulerConfig().metrics_staleness_threshold
ADAPTERS = ["a", "b", "c"]
CHECKS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- the reference: the plain definitions -------------------------------------------------------
def reference_fresh(pods: Sequence[PodMetrics], now: float) -> list[PodMetrics]:
    return [p for p in pods if p.is_fresh(now, THRESHOLD)]


def reference_rank(
    config: SchedulerConfig, rng: random.Random, request: LLMRequest, pods: list[PodMetrics], limit: int
) -> list[PodMetrics]:
    if not pods:
        raise NoEndpoints("no ready endpoints")
    limit = max(1, limit)
    fresh = reference_fresh(pods, NOW)
    if not fresh:
        if request.critical:
            first = rng.choice(pods)
            return [first, *[p for p in pods if p is not first][: limit - 1]]
        raise ResourceExhausted("no fresh metrics")
    if not request.critical and not any(
        p.metrics.waiting_queue_size <= config.queue_threshold_critical
        and p.metrics.kv_cache_usage <= config.kv_cache_threshold
        for p in fresh
    ):
        raise ResourceExhausted(DROP_MESSAGE)
    if len(fresh) == 1:
        return [fresh[0]]
    picker = PICKER_FUNCS[config.scoring_profile.picker]
    if picker is pick_random and limit == 1:
        return [rng.choice(fresh)]
    totals = total_scores(request, fresh, config)
    first = rng.choice(fresh) if picker is pick_random else picker(fresh, totals, rng)
    if limit == 1:
        return [first]
    rest = sorted((i for i, p in enumerate(fresh) if p is not first), key=lambda i: (-totals[i], i))
    return [first, *(fresh[i] for i in rest[: limit - 1])]


def outcome(
    rank: object, rng: random.Random, *args: object
) -> tuple[str, list[int] | type[EppError], object]:
    """What a rank call did: the pods (by identity) or the error type, and the RNG's state after."""
    try:
        pods = rank(*args)  # type: ignore[operator]
    except EppError as err:
        return ("error", type(err), rng.getstate())
    return ("pods", [id(p) for p in pods], rng.getstate())


def bits(values: Sequence[float]) -> list[bytes]:
    """Exact float identity (NaN included): the totals must agree to the last bit, not approximately."""
    return [struct.pack("<d", v) for v in values]


# --- random inputs -------------------------------------------------------------------------------
adapter_sets = st.frozensets(st.sampled_from(ADAPTERS), max_size=3)
kv_usage = st.one_of(
    st.sampled_from([0.0, 0.5, 0.8, 1.0]),
    st.floats(0.0, 1.0),
    st.floats(-0.5, 1.5),
)  # finite: the metrics parser refuses NaN and infinities (epp.backend.metrics.parse)
scrape_time = st.one_of(
    st.just(NOW),
    st.floats(NOW - THRESHOLD, NOW),
    st.sampled_from([NOW - THRESHOLD, NOW - THRESHOLD - 1e-6, NOW - 60.0, None, math.nan]),
)


@st.composite
def pod_metrics(draw: st.DrawFn, name: str) -> PodMetrics:
    return PodMetrics(
        Pod(EndpointKey("default", name, draw(st.integers(0, 1))), "10.0.0.1", 8000),
        Metrics(
            waiting_queue_size=draw(st.one_of(st.integers(0, 12), st.sampled_from([127, 128, 200]))),
            running_queue_size=draw(st.integers(0, 6)),
            kv_cache_usage=draw(kv_usage),
            active_models=draw(adapter_sets),
            waiting_models=draw(adapter_sets),
            max_active_models=draw(st.integers(0, 3)),
            updated_at=draw(scrape_time),
        ),
        Dispatched(
            draw(st.integers(0, 5)),
            draw(st.frozensets(st.sampled_from([*ADAPTERS, "base"]), max_size=2)),
            draw(st.integers(0, 60)),
        ),
    )


@st.composite
def pod_lists(draw: st.DrawFn) -> list[PodMetrics]:
    # Names from a small set: keys repeat now and then, as the index must notice.
    names = draw(st.lists(st.sampled_from([f"p{i}" for i in range(40)]), min_size=1, max_size=24))
    pods = [draw(pod_metrics(name)) for name in names]
    if len(pods) > 1 and draw(st.booleans()) and draw(st.booleans()):
        pods.append(pods[0])  # the same snapshot twice: fallbacks exclude the pick by identity
    return pods


@st.composite
def requests(draw: st.DrawFn, pods: list[PodMetrics]) -> LLMRequest:
    keys = [p.pod.key for p in pods] + [EndpointKey("default", "gone")]
    matches = draw(st.dictionaries(st.sampled_from(keys), st.integers(0, 12), max_size=len(keys)))
    return LLMRequest(
        "m",
        draw(st.sampled_from([*ADAPTERS, "base"])),
        critical=draw(st.booleans()),
        prefix_blocks=draw(st.one_of(st.integers(1, 10), st.just(0))),
        prefix_matches=matches,
    )


weights = st.one_of(st.sampled_from([0.0, 1.0, 2.0, 3.0]), st.floats(0.0, 10.0))


@st.composite
def configs(draw: st.DrawFn) -> SchedulerConfig:
    kinds = draw(st.lists(st.sampled_from(SCORER_KINDS), max_size=7))
    if draw(st.booleans()):
        kinds.append(PREFIX_SCORER)  # last: the sparse path, with a weight that rounds
    profile = ScoringProfile(
        tuple(WeightedScorer(kind, draw(weights)) for kind in kinds), draw(st.sampled_from(PICKERS))
    )
    return SchedulerConfig(
        kind=SCORER,
        profile=profile,
        queueing_threshold_lora=draw(st.sampled_from([0, 5, 128])),
        queue_threshold_critical=draw(st.sampled_from([0, 5, 128])),
        kv_cache_threshold=draw(st.sampled_from([0.0, 0.5, 0.8, 1.0])),
    )


# These two profiles are the ones the EPP runs (ours without a config, upstream's from examples/):
# sampled on every example beside a random one, so the fused and sparse paths are always exercised.
OUR_DEFAULT = SchedulerConfig(kind=SCORER)
UPSTREAM_DEFAULT = SchedulerConfig(
    kind=SCORER,
    profile=ScoringProfile(
        (
            WeightedScorer(QUEUE_SCORER, 2.0),
            WeightedScorer(KV_CACHE_SCORER, 2.0),
            WeightedScorer(PREFIX_SCORER, 3.0),
        )
    ),
)


@st.composite
def upstream_shaped(draw: st.DrawFn) -> SchedulerConfig:
    """Upstream's profile with other weights: the fused pair and the sparse prefix, where the order
    of a product's factors shows in the last bit (Hypothesis's favourite weights, 0, 1 and 10, hide it)."""
    w = st.floats(0.01, 10.0)
    return SchedulerConfig(
        kind=SCORER,
        profile=ScoringProfile(
            (
                WeightedScorer(QUEUE_SCORER, draw(w)),
                WeightedScorer(KV_CACHE_SCORER, draw(w)),
                WeightedScorer(PREFIX_SCORER, draw(w)),
            )
        ),
    )


any_config = st.one_of(st.sampled_from([OUR_DEFAULT, UPSTREAM_DEFAULT]), configs(), upstream_shaped())


# --- the properties ------------------------------------------------------------------------------
@CHECKS
@given(data=st.data(), config=any_config)
def test_compiled_totals_are_the_reference_totals_to_the_bit(
    data: st.DataObject, config: SchedulerConfig
) -> None:
    pods = data.draw(pod_lists())
    request = data.draw(requests(pods))
    compiled = CompiledProfile(config)
    assert bits(compiled.totals(request, pods)) == bits(total_scores(request, pods, config))
    # The key index kept from the call before must not leak into a different pod list.
    shuffled = data.draw(st.permutations(pods))
    assert bits(compiled.totals(request, shuffled)) == bits(total_scores(request, shuffled, config))


@CHECKS
@given(data=st.data(), config=any_config, seed=st.integers(0, 2**16), limit=st.integers(0, 5))
def test_rank_decides_as_the_reference(
    data: st.DataObject, config: SchedulerConfig, seed: int, limit: int
) -> None:
    pods = data.draw(pod_lists())
    fast_rng, reference_rng = random.Random(seed), random.Random(seed)
    scheduler = ScorerScheduler(config, fast_rng, clock=lambda: NOW)
    # One scheduler over several pod lists, as in the EPP: the list, a reordering, a part of it.
    for candidates in (pods, data.draw(st.permutations(pods)), pods[: data.draw(st.integers(1, len(pods)))]):
        request = data.draw(requests(candidates))
        fast = outcome(scheduler.rank, fast_rng, request, candidates, limit)
        reference = outcome(reference_rank, reference_rng, config, reference_rng, request, candidates, limit)
        assert fast == reference


@CHECKS
@given(pods=pod_lists(), now=st.sampled_from([NOW, NOW + 0.5, NOW + THRESHOLD, NOW + 120.0]))
def test_fresh_pods_is_the_per_pod_test(pods: list[PodMetrics], now: float) -> None:
    assert [id(p) for p in fresh_pods(pods, now, THRESHOLD)] == [id(p) for p in reference_fresh(pods, now)]


@CHECKS
@given(
    totals=st.lists(
        st.one_of(st.sampled_from([0.0, 1.0, 2.5]), st.floats(0.0, 10.0), st.just(math.nan)), min_size=1
    ),
    count=st.integers(0, 6),
    data=st.data(),
)
def test_ranked_rest_is_the_full_sort(totals: list[float], count: int, data: st.DataObject) -> None:
    pods = [PodMetrics(Pod(EndpointKey("default", f"p{i}"), "10.0.0.1", 8000)) for i in range(len(totals))]
    if data.draw(st.booleans()):
        dup = data.draw(st.integers(0, len(pods) - 1))
        pods[dup] = pods[0]
    first = pods[data.draw(st.integers(0, len(pods) - 1))]
    others = sorted((i for i, p in enumerate(pods) if p is not first), key=lambda i: (-totals[i], i))
    assert ranked_rest(pods, totals, first, count) == [pods[i] for i in others[:count]]


@pytest.mark.parametrize(
    ("update", "fresh"),
    [
        pytest.param({}, True, id="all-fresh"),
        pytest.param({"updated_at": None}, False, id="never-scraped"),
        pytest.param({"updated_at": math.nan}, False, id="nan-time"),
        pytest.param({"updated_at": NOW - THRESHOLD - 1.0}, False, id="stale"),
    ],
)
def test_fresh_pods_takes_one_odd_pod_out(update: dict[str, object], fresh: bool) -> None:
    pods = [
        PodMetrics(Pod(EndpointKey("default", f"p{i}"), "10.0.0.1", 8000), Metrics(updated_at=NOW))
        for i in range(4)
    ]
    pods[2] = dataclasses.replace(pods[2], metrics=dataclasses.replace(pods[2].metrics, **update))  # type: ignore[arg-type]
    expected = pods if fresh else [pods[0], pods[1], pods[3]]
    assert fresh_pods(pods, NOW, THRESHOLD) == expected


@pytest.mark.parametrize(
    "profile",
    [
        pytest.param((WeightedScorer(PREFIX_SCORER, 3.0),), id="prefix-alone-a-column"),
        pytest.param(
            (WeightedScorer(PREFIX_SCORER, 3.0), WeightedScorer(QUEUE_SCORER, 1.0)), id="prefix-first"
        ),
        pytest.param(
            (WeightedScorer(QUEUE_SCORER, 1.0), WeightedScorer(PREFIX_SCORER, 3.0)), id="prefix-sparse"
        ),
    ],
)
def test_a_one_block_prefix_is_credited_on_every_path(profile: tuple[WeightedScorer, ...]) -> None:
    """The shortest prefix that counts (one block: a short system prompt) still draws requests to the
    pod that holds it, whichever path the column takes (alone, first, or added sparsely last)."""
    pods = [
        PodMetrics(Pod(EndpointKey("default", f"p{i}"), "10.0.0.1", 8000), Metrics(updated_at=NOW))
        for i in range(3)
    ]
    config = SchedulerConfig(kind=SCORER, profile=ScoringProfile(profile))
    request = LLMRequest("m", "m", critical=True, prefix_blocks=1, prefix_matches={pods[1].pod.key: 1})
    totals = CompiledProfile(config).totals(request, pods)
    assert bits(totals) == bits(total_scores(request, pods, config))
    assert totals[1] - totals[0] == 3.0


def crafted(
    name: str, queue: int, kv: float, active: set[str], waiting: set[str], flying: set[str]
) -> PodMetrics:
    return PodMetrics(
        Pod(EndpointKey("default", name), "10.0.0.1", 8000),
        Metrics(
            waiting_queue_size=queue,
            kv_cache_usage=kv,
            active_models=frozenset(active),
            waiting_models=frozenset(waiting),
            max_active_models=2,
            updated_at=NOW,
        ),
        Dispatched(len(flying) * 2, frozenset(flying), 0),
    )


# Every column tells these pods apart, and the LoRA column's corner cases are in them: "x" in flight
# to b is an adapter because it runs on a (active elsewhere) and "w" in flight to c because it waits
# on d (waiting elsewhere); each fills its pod's second slot.
CRAFTED = [
    crafted("a", 1, 0.1, {"x", "t"}, set(), set()),
    crafted("b", 3, 0.7, {"y"}, set(), {"x"}),
    crafted("c", 0, 0.4, {"y"}, set(), {"w"}),
    crafted("d", 2, 0.9, set(), {"w"}, set()),
]


@pytest.mark.parametrize(
    "profile",
    [
        pytest.param(((IN_FLIGHT_SCORER, 1.0), (KV_CACHE_SCORER, 2.0)), id="kv-second-after-another"),
        pytest.param(((KV_CACHE_SCORER, 2.0), (QUEUE_SCORER, 1.0)), id="queue-and-kv-swapped"),
        pytest.param(
            ((QUEUE_SCORER, 1.0), (PREFIX_SCORER, 3.0), (KV_CACHE_SCORER, 2.0)), id="prefix-in-the-middle"
        ),
        pytest.param(((LORA_SCORER, 1.0), (QUEUE_SCORER, 0.5)), id="lora-adapters-in-flight"),
    ],
)
def test_each_path_of_the_compiled_profile_is_taken_only_where_it_applies(
    profile: tuple[tuple[str, float], ...],
) -> None:
    """The fused queue-and-KV column only for queue then KV, the sparse prefix only when last: for
    pods on which every column differs (Hypothesis draws these profiles too rarely to be relied on)."""
    config = SchedulerConfig(
        kind=SCORER, profile=ScoringProfile(tuple(WeightedScorer(kind, w) for kind, w in profile))
    )
    request = LLMRequest("m", "t", critical=True, prefix_blocks=4, prefix_matches={CRAFTED[3].pod.key: 2})
    assert bits(CompiledProfile(config).totals(request, CRAFTED)) == bits(
        total_scores(request, CRAFTED, config)
    )
