"""The scorer scheduler: weighted scorers, the highest total wins (the approach of upstream's later
releases and of llm-d's router), as an alternative to the v0.3.0 filter tree.

Each scorer maps every candidate pod to [0, 1]; the pick is the pod with the largest weighted sum,
ties broken at random. All pure functions of the request and the pods' snapshots:

* queue: the scraped waiting queue, min-max normalised (the shortest scores 1; all equal: all 1).
* KV cache: 1 - scraped KV-cache usage.
* in flight: the EPP's own count of requests it routed to the pod whose responses have not ended
  (``PodMetrics.dispatched``), min-max normalised. Exact and never stale, unlike the scrapes, so
  it keeps two requests arriving between scrapes from piling onto the same "idle" pod.
* LoRA affinity: for a target that is an adapter (some pod reports it in its LoRA metric), 1 where
  it is already running (scraped or in flight), 0.5 where a free adapter slot can load it (LORA_ROOM),
  0.25 where requests for it already wait for a slot (LORA_WAITING), 0 where every slot is held by
  other running adapters (a request sent there waits until one of them drains completely). For the
  base model: 1 everywhere.
  The adapters a pod runs are counted from the EPP's in-flight targets too, so the slots taken since
  the last scrape are known. A pod whose queue has reached queueing_threshold_lora (128) scores 0
  whatever it runs, as the filter tree drops affinity there.
* prefix: the share of the request's prompt blocks the pod was already sent (a likely prefix-cache
  hit, ``LLMRequest.prefix_matches``).
* running requests: the scraped running-request count, min-max normalised (off by default).
* last routed: how many dispatches ago (over the whole pool) the EPP last routed a request to the
  pod, ``Dispatched.last``, as a share of the pool size, capped at 1: the pod sent a request just
  now scores 0, one not chosen in the last N dispatches (N pods) scores 1. Exact and never stale,
  like the in-flight count; it spaces each pod's arrivals out, so requests arriving close together
  do not share one engine's next step (their prefills would, and TTFT grows with the prefill tokens
  of a step) while other pods' steps carry none.
* predicted TTFT: the time to the request's first token the engine's step model
  (`SchedulerConfig.step_model`) predicts on each pod from the EPP's own accounting (prompts still
  prefilling there, requests and context in flight, the step the engine is in, the prompt's cached
  prefix; `predicted_ttft_scores`), as best / predicted. It keeps a request off a pod whose engine
  is still prefilling a prompt sent a moment ago, or has just begun a step, without rotating
  requests over idle pods: an idle pod's prediction depends only on the prompt.

Which scorers, their weights and the picker come from `SchedulerConfig.scoring_profile`: our
measured default (`ScorerWeights`), or a profile from an EndpointPickerConfig file (epp.pickerconfig).
Pickers: the highest total with ties at random (the default, upstream's max-score-picker), a
uniform draw, or a draw in proportion to the totals.

Admission is the same as upstream v0.4's saturation detector and the filter tree's: a non-critical
request is shed (429) when no fresh pod has queue <= queue_threshold_critical and KV <=
kv_cache_threshold. Staleness as in the filter tree: scores use fresh pods only; with none fresh,
Critical requests go to a uniform draw and the rest are shed.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from epp.api.types import EndpointKey
from epp.config import (
    CHARS_PER_TOKEN,
    DEFAULT_QUEUEING_THRESHOLD_LORA,
    IN_FLIGHT_SCORER,
    KV_CACHE_SCORER,
    LAST_ROUTED_SCORER,
    LORA_SCORER,
    MAX_SCORE_PICKER,
    PREDICTED_TTFT_SCORER,
    PREFIX_SCORER,
    QUEUE_SCORER,
    RANDOM_PICKER,
    RUNNING_REQUESTS_SCORER,
    WEIGHTED_RANDOM_PICKER,
    SchedulerConfig,
    StepModel,
)
from epp.datastore.types import PodMetrics
from epp.errors import ResourceExhausted
from epp.scheduling.filters import LLMRequest
from epp.scheduling.scheduler import DROP_MESSAGE, FreshPodsScheduler

Scores = list[float]

LORA_RUNNING = 1.0
LORA_ROOM = 0.5
LORA_WAITING = 0.25
LORA_BLOCKED = 0.0


def min_max(values: Sequence[float]) -> Scores:
    """1 for the smallest value, 0 for the largest, linear between; all 1 when they are equal."""
    low, high = min(values), max(values)
    if high <= low:
        return [1.0] * len(values)
    return [(high - v) / (high - low) for v in values]


def queue_scores(request: LLMRequest, pods: Sequence[PodMetrics]) -> Scores:
    return min_max([p.metrics.waiting_queue_size for p in pods])


def kv_cache_scores(request: LLMRequest, pods: Sequence[PodMetrics]) -> Scores:
    # Clamped to [0, 1] inline: min()/max() calls per pod cost more than the rest of the scorer.
    return [1.0 - (1.0 if (u := p.metrics.kv_cache_usage) > 1.0 else 0.0 if u < 0.0 else u) for p in pods]


def in_flight_scores(request: LLMRequest, pods: Sequence[PodMetrics]) -> Scores:
    """1 - count / (busiest + 1): proportional, so one request more is a small difference on busy
    pods (min-max would turn 12 against 13 in flight into 1 against 0)."""
    counts = [p.dispatched.count for p in pods]
    scale = max(counts) + 1
    return [1.0 - c / scale for c in counts]


def lora_scores(
    request: LLMRequest, pods: Sequence[PodMetrics], queue_limit: int = DEFAULT_QUEUEING_THRESHOLD_LORA
) -> Scores:
    adapters: set[str] = set()
    for p in pods:
        adapters |= p.metrics.active_models
        adapters |= p.metrics.waiting_models
    target = request.target_model
    if target not in adapters:
        return [1.0] * len(pods)  # the base model, or an adapter no pod has reported yet
    out: Scores = []
    for p in pods:
        m = p.metrics
        running = (m.active_models | p.dispatched.models) & adapters
        if m.waiting_queue_size >= queue_limit:
            out.append(LORA_BLOCKED)  # as the filter tree: no affinity with a pod this far behind
        elif target in running:
            out.append(LORA_RUNNING)
        elif len(running) < m.max_active_models:
            out.append(LORA_ROOM)
        elif target in m.waiting_models:
            out.append(LORA_WAITING)
        else:
            out.append(LORA_BLOCKED)
    return out


def prefix_scores(request: LLMRequest, pods: Sequence[PodMetrics]) -> Scores:
    if request.prefix_blocks <= 0 or not request.prefix_matches:
        return [0.0] * len(pods)
    get = request.prefix_matches.get
    scale = 1.0 / request.prefix_blocks
    return [get(p.pod.key, 0) * scale for p in pods]


def running_requests_scores(request: LLMRequest, pods: Sequence[PodMetrics]) -> Scores:
    """The scraped running-request count, min-max normalised (upstream's running-requests-size-scorer)."""
    return min_max([p.metrics.running_queue_size for p in pods])


def last_routed_scores(request: LLMRequest, pods: Sequence[PodMetrics]) -> Scores:
    """min(dispatches since the pod was last routed to, N) / N for N pods (never routed: as old as
    the pool's first dispatch)."""
    lasts = [p.dispatched.last for p in pods]
    newest = max(lasts)
    n = len(pods)
    return [(newest - last if newest - last < n else n) / n for last in lasts]


def prefix_holders(
    matches: Mapping[EndpointKey, int],
    pods: Sequence[PodMetrics],
    index: Mapping[EndpointKey, int] | None,
) -> Iterator[tuple[int, int]]:
    """(position in `pods`, blocks held) of each pod holding a prefix of the prompt: through `index`
    (`columns.KeyIndex`), one lookup per holder, usually a handful of the pods; without one (a key
    repeats, or none is kept), by walking every pod."""
    if index is not None:
        for key, blocks in matches.items():
            i = index.get(key)
            if i is not None and blocks:
                yield i, blocks
    else:
        for i, p in enumerate(pods):
            blocks = matches.get(p.pod.key, 0)
            if blocks:
                yield i, blocks


def predicted_ttft_scores(
    request: LLMRequest,
    pods: Sequence[PodMetrics],
    block_chars: int,
    step: StepModel,
    index: Mapping[EndpointKey, int] | None = None,
) -> Scores:
    """best / predicted, the prediction (seconds until the request's first token on that pod, under
    `step`'s cost model) from what the EPP itself knows now, never stale:

    * the rest of the step the engine is in: none on an idle pod (nothing in flight, none running
      at the last scrape); on a pod whose first byte of a response came back ``age`` ago while this
      EPP still has requests in flight there, a decode step began then, so ``step - age`` of it is
      left; elsewhere half a step, as likely as not (once the EPP's own requests there have ended,
      that first byte says nothing of the steps others' requests keep the engine taking);
    * the step that prefills it: the prefills sent there ahead of it (``prefill_tokens``), one decode
      token for each request in flight there and their context, its own decode token and context,
      and its own prompt less the blocks the pod already holds (``prefix_matches``).

    Without ``request.prefills_observed`` every pod scores 0, which leaves every total as the rest of
    the profile makes it, to the bit (a constant 1 would too, but for rounding): the accounting then
    cannot tell a pod
    prefilling a long prompt from one that is not, and the prompt's cached prefix alone would herd
    requests onto the pods holding it (measured in virtual time: TTFT p99 290 against 173 ms on
    prefix-heavy at 16 engines).

    On the hot path: one pass over the pods, then one over those holding a prefix of the prompt,
    found through `index` (each pod's position by key, `columns.KeyIndex`; None when a key repeats
    or none is kept: then every pod is looked up).
    """
    if not request.prefills_observed:
        return [0.0] * len(pods)
    base, per_prefill = step.base_s, step.prefill_token_s
    per_sequence, per_context = step.decode_sequence_s, step.context_token_s
    own = request.prompt_tokens
    now = request.received_at
    ahead: list[float] = []  # per pod: the rest of its step, the decode step, the prefills ahead
    append = ahead.append
    for p in pods:
        d = p.dispatched
        count = d.count
        if not count and not p.metrics.running_queue_size:
            append(base)
            continue
        decode = base + per_sequence * count + per_context * d.prompt_tokens
        at = d.prefilled_at
        if not count or at is None or not 0.0 <= (age := now - at) < decode:
            append(1.5 * decode + per_prefill * d.prefill_tokens)
        else:
            append((decode - age) + decode + per_prefill * d.prefill_tokens)
    mine = per_sequence + per_context * own
    cold = mine + per_prefill * own
    predicted = [t + cold for t in ahead]
    matches = request.prefix_matches
    if request.prefix_blocks > 0 and matches:
        block_tokens = block_chars / CHARS_PER_TOKEN
        for i, blocks in prefix_holders(matches, pods, index):
            uncached = own - blocks * block_tokens
            predicted[i] = ahead[i] + (mine + per_prefill * (uncached if uncached > 0.0 else 0.0))
    best = min(predicted)
    return [best / t for t in predicted]


Scorer = Callable[[LLMRequest, Sequence[PodMetrics], SchedulerConfig], Scores]

# Our scorer names (epp.config.SCORER_KINDS) -> the scorer.
SCORERS: dict[str, Scorer] = {
    QUEUE_SCORER: lambda r, p, c: queue_scores(r, p),
    KV_CACHE_SCORER: lambda r, p, c: kv_cache_scores(r, p),
    IN_FLIGHT_SCORER: lambda r, p, c: in_flight_scores(r, p),
    LORA_SCORER: lambda r, p, c: lora_scores(r, p, c.queueing_threshold_lora),
    PREFIX_SCORER: lambda r, p, c: prefix_scores(r, p),
    RUNNING_REQUESTS_SCORER: lambda r, p, c: running_requests_scores(r, p),
    LAST_ROUTED_SCORER: lambda r, p, c: last_routed_scores(r, p),
    PREDICTED_TTFT_SCORER: lambda r, p, c: predicted_ttft_scores(r, p, c.prefix_block_chars, c.step_model),
}


def weighted_scorers(config: SchedulerConfig) -> tuple[tuple[Scorer, float], ...]:
    """The profile's scorers with a non-zero weight, in profile order."""
    return tuple((SCORERS[s.kind], s.weight) for s in config.scoring_profile.scorers if s.weight > 0)


def total_scores(request: LLMRequest, pods: Sequence[PodMetrics], config: SchedulerConfig) -> Scores:
    return _totals(request, pods, config, weighted_scorers(config))


def _totals(
    request: LLMRequest,
    pods: Sequence[PodMetrics],
    config: SchedulerConfig,
    scorers: Sequence[tuple[Scorer, float]],
) -> Scores:
    totals: Scores | None = None
    for scorer, weight in scorers:
        scores = scorer(request, pods, config)
        if totals is None:
            totals = [weight * score for score in scores]
        else:
            totals = [total + weight * score for total, score in zip(totals, scores, strict=True)]
    return totals if totals is not None else [0.0] * len(pods)


# --- pickers: one pod from the candidates and their totals (pure apart from the injected RNG) ---------
Picker = Callable[[list[PodMetrics], Scores, random.Random], PodMetrics]


def pick_max_score(pods: list[PodMetrics], totals: Scores, rng: random.Random) -> PodMetrics:
    """The highest total; ties at random."""
    cut = max(totals) - 1e-9
    winners = [p for p, total in zip(pods, totals, strict=True) if total >= cut]
    return winners[0] if len(winners) == 1 else rng.choice(winners)


def pick_random(pods: list[PodMetrics], totals: Scores, rng: random.Random) -> PodMetrics:
    """Uniformly at random; the scores play no part."""
    return rng.choice(pods)


def pick_weighted_random(pods: list[PodMetrics], totals: Scores, rng: random.Random) -> PodMetrics:
    """At random in proportion to the totals; uniformly when every total is 0."""
    weights = [max(0.0, t) for t in totals]
    if sum(weights) <= 0:
        return rng.choice(pods)
    return rng.choices(pods, weights=weights, k=1)[0]


def ranked_rest(
    pods: Sequence[PodMetrics], totals: Scores, first: PodMetrics, count: int
) -> list[PodMetrics]:
    """Up to `count` pods other than `first`, highest total first, equal totals in the given order:
    ``sorted(others, key=lambda i: (-totals[i], i))[:count]`` without sorting them all. Stable
    selection by total alone gives the same order when the totals are finite (NaN is unordered: the
    sort above is kept for it)."""
    if count <= 0:
        return []
    n = len(pods)
    if math.isfinite(sum(totals)):
        # One more than asked, in case `first` is among the best; nlargest is stable, as sorted is.
        top = heapq.nlargest(count + 1, range(n), key=totals.__getitem__)
        rest = [i for i in top if pods[i] is not first]
        if len(rest) >= count or len(top) == n:
            return [pods[i] for i in rest[:count]]
    others = sorted((i for i, p in enumerate(pods) if p is not first), key=lambda i: (-totals[i], i))
    return [pods[i] for i in others[:count]]


PICKERS: dict[str, Picker] = {
    MAX_SCORE_PICKER: pick_max_score,
    RANDOM_PICKER: pick_random,
    WEIGHTED_RANDOM_PICKER: pick_weighted_random,
}


class ScorerScheduler(FreshPodsScheduler):
    """Same interface as `Scheduler`: `schedule(request, pods)` -> a pod, or NoEndpoints/ResourceExhausted."""

    def __init__(
        self,
        config: SchedulerConfig,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        pool_name: str = "",
    ) -> None:
        super().__init__(config, rng, clock, pool_name=pool_name)
        from epp.scheduling.columns import CompiledProfile  # here: columns imports this module

        # Resolved once: the profile never changes while the scheduler lives. The totals come from
        # the compiled profile (epp.scheduling.columns), identical to `total_scores` and faster.
        self._totals = CompiledProfile(config).totals
        self._picker = PICKERS[config.scoring_profile.picker]

    def _rank(self, request: LLMRequest, fresh: list[PodMetrics], limit: int) -> list[PodMetrics]:
        """The profile's picker's choice first (max score: the highest total, ties drawn at random),
        then the next highest totals from the same scoring; fallbacks with equal totals keep the pods'
        given order."""
        config = self._config
        if not request.critical and not any(
            p.metrics.waiting_queue_size <= config.queue_threshold_critical
            and p.metrics.kv_cache_usage <= config.kv_cache_threshold
            for p in fresh
        ):
            raise ResourceExhausted(DROP_MESSAGE)
        if len(fresh) == 1:
            return [fresh[0]]
        if self._picker is pick_random and limit == 1:
            return [self._rng.choice(fresh)]  # no scoring needed for one random pick
        totals = self._totals(request, fresh)
        first = (
            self._rng.choice(fresh) if self._picker is pick_random else self._picker(fresh, totals, self._rng)
        )
        if limit == 1:
            return [first]
        return [first, *ranked_rest(fresh, totals, first, limit - 1)]
