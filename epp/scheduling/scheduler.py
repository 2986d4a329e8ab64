"""Pick one pod for a request: staleness split, then the v0.3.0 filter tree, then a uniform draw.

The tree (epp-behaviour.md §5.3, thresholds from `SchedulerConfig`):

    critical request? (pass all if Critical, else fail)
     ├─ success → low queueing (queue < queueing_threshold_lora)
     │     ├─ success → LoRA soft affinity ─(either)→ least queuing → least KV cache
     │     └─ failure → least queuing → LoRA soft affinity ─(either)→ least KV cache
     └─ failure → has capacity for sheddable (queue ≤ queue_threshold_critical AND kv ≤ kv_cache_threshold)
           ├─ success → least queuing → LoRA soft affinity ─(either)→ least KV cache
           └─ failure → drop: ResourceExhausted (429)

Decisions that differ from upstream v0.3.0 (DESIGN.md §2):
- Zero pods is `NoEndpoints` (503), not upstream's 429: there is nothing to shed load from.
- Staleness. A pod's metrics are fresh when scraped within `metrics_staleness_threshold`. The tree
  runs over the fresh pods only; stale and never-scraped pods are not evidence of anything (a pod
  whose scrapes fail reports zeros and would look idle — upstream #336). When NO pod is fresh:
  * a Critical request is still served, by a uniform draw over all pods — the tree's ordering on
    old numbers is meaningless, and Critical traffic is never dropped while a pod exists;
  * any other request is shed with 429: capacity for sheddable traffic cannot be shown without
    fresh metrics. This is also what upstream v0.4.0's saturation detector does (no fresh pod ⇒
    saturated ⇒ non-critical dropped). The message says why, so an operator seeing 429s looks at the
    prober rather than at load.
  Stale pods are never mixed with fresh ones: fresh pods without capacity shed a sheddable request
  even if a stale pod last reported room.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from epp.config import SchedulerConfig
from epp.datastore.types import PodMetrics
from epp.errors import NoEndpoints, ResourceExhausted
from epp.scheduling.filters import (
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

DROP_MESSAGE = "dropping request due to limited backend resources"
NO_FRESH_METRICS_MESSAGE = "dropping request: no pod has fresh metrics (older than {threshold:g}s)"


class FreshPodsScheduler:
    """What both schedulers share (module docstring): no pod is 503; only fresh pods are weighed;
    with none fresh, a Critical request gets a uniform draw over all pods and the rest are shed.
    Subclasses rank the fresh pods in `_rank`: the pick first, then fallbacks from the same decision
    (the ext_proc destination is a comma list, primary first)."""

    def __init__(
        self,
        config: SchedulerConfig,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        pool_name: str = "",
    ) -> None:
        self._config = config
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._pool_name = pool_name

    def schedule(self, request: LLMRequest, pods: Sequence[PodMetrics]) -> PodMetrics:
        """One pod for `request`; raises NoEndpoints (503) or ResourceExhausted (429)."""
        return self.rank(request, pods, 1)[0]

    def rank(self, request: LLMRequest, pods: Sequence[PodMetrics], limit: int) -> list[PodMetrics]:
        """The pick first, then fallbacks from the same decision, at most `limit` pods in all.

        The first pod is the one `schedule` returns (the same draws from the RNG come first). The
        fallbacks are fresh pods only, best first (`_rank`); with no pod fresh, a Critical request's
        fallbacks are the other pods in their given order. Raises as `schedule` does.
        """
        if not pods:
            where = f" in pool {self._pool_name}" if self._pool_name else ""
            raise NoEndpoints(f"no ready endpoints{where}")
        limit = max(1, limit)
        threshold = self._config.metrics_staleness_threshold
        now = self._clock()
        fresh = fresh_pods(pods, now, threshold)
        if not fresh:
            if request.critical:
                first = self._rng.choice(pods)
                return [first, *[p for p in pods if p is not first][: limit - 1]]
            raise ResourceExhausted(NO_FRESH_METRICS_MESSAGE.format(threshold=threshold))
        return self._rank(request, fresh, limit)

    def _rank(self, request: LLMRequest, fresh: list[PodMetrics], limit: int) -> list[PodMetrics]:
        raise NotImplementedError


class Scheduler(FreshPodsScheduler):
    """The v0.3.0 filter tree over the fresh pods, then a uniform draw among the survivors."""

    @functools.cached_property
    def _tree(self) -> FilterNode:
        return build_tree(self._config, self._rng)

    def _rank(self, request: LLMRequest, fresh: list[PodMetrics], limit: int) -> list[PodMetrics]:
        """The tree's pick, then what the tree picks among the pods left when the earlier picks are
        gone, and so on: fallback k is the pod the tree would choose if the k better ones vanished.
        A run that sheds (no pod left with capacity for a sheddable request) ends the list."""
        ranked = [self._pick(request, fresh)]
        left = fresh
        while len(ranked) < limit:
            left = [p for p in left if p is not ranked[-1]]
            if not left:
                break
            try:
                ranked.append(self._pick(request, left))
            except ResourceExhausted:
                break
        return ranked

    def _pick(self, request: LLMRequest, pods: list[PodMetrics]) -> PodMetrics:
        survivors = self._tree.run(request, pods)
        if not survivors:
            # Unreachable with the v0.3.0 tree (only the drop node ends empty, and it raises).
            raise ResourceExhausted(DROP_MESSAGE)
        return self._rng.choice(survivors)


def fresh_pods(pods: Sequence[PodMetrics], now: float, threshold: float) -> list[PodMetrics]:
    """The pods whose metrics are fresh (PodMetrics.is_fresh), in their given order.

    Usually every pod is: then the oldest scrape decides for all (``now - u`` only grows as ``u``
    falls), found by two C-level passes instead of a Python-level test per pod. ``sum`` raises on a
    never-scraped pod (None) and is NaN when a time is; both take the pod-by-pod test.
    """
    times: list[Any] = [p.metrics.updated_at for p in pods]  # float | None: None raises in sum()
    try:
        all_fresh = not math.isnan(sum(times)) and now - min(times) <= threshold
    except TypeError:
        all_fresh = False
    if all_fresh:
        return pods if isinstance(pods, list) else list(pods)  # never mutated: no copy needed
    return [p for p in pods if (u := p.metrics.updated_at) is not None and now - u <= threshold]


def build_tree(config: SchedulerConfig, rng: random.Random) -> FilterNode:
    """The v0.3.0 decision tree as data; the RNG is shared with the final draw."""
    soft_affinity = lora_soft_affinity(config.lora_affinity_threshold, rng)
    # Upstream's node names in the comments.
    least_kv = FilterNode(least_kv_cache)  # "least KV cache percent"
    queue_and_kv = FilterNode(least_queuing, on_success_or_failure=least_kv)  # "least queuing"
    queue_lora_and_kv = FilterNode(  # "least queuing"
        least_queuing,
        on_success_or_failure=FilterNode(soft_affinity, on_success_or_failure=least_kv),  # "low cost LoRA"
    )
    low_latency = FilterNode(  # "low queueing"
        low_queueing(config.queueing_threshold_lora),
        on_success=FilterNode(soft_affinity, on_success_or_failure=queue_and_kv),  # "affinity LoRA"
        on_failure=queue_lora_and_kv,
    )
    sheddable = FilterNode(  # "has capacity for sheddable requests"
        has_capacity_for_sheddable(config.queue_threshold_critical, config.kv_cache_threshold),
        on_success=queue_lora_and_kv,
        on_failure=FilterNode(_drop),  # "drop request"
    )
    return FilterNode(critical_request, on_success=low_latency, on_failure=sheddable)  # "critical request"


def _drop(_: LLMRequest, pods: Pods) -> Pods:
    raise ResourceExhausted(DROP_MESSAGE)
