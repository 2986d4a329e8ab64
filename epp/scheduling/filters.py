"""The filter engine and the filters of the v0.3.0 tree (epp-behaviour.md §5.1, §5.3).

Everything here is a pure function of the request and a list of pod snapshots (plus an injected
RNG for the soft-affinity coin), so each filter is table-tested on its own and the tree is just
data. A filter returns the pods it keeps; an empty list means "failed" and the engine then hands
the ORIGINAL input to the failure branch, exactly as upstream's engine does. A filter may raise an
`EppError` to end scheduling (the drop node).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from epp.api.types import EndpointKey
from epp.datastore.types import PodMetrics

NO_MATCHES: Mapping[EndpointKey, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """What scheduling needs of a request. `target_model` is the resolved model (LoRA adapter).

    `prefix_blocks` is how many prompt blocks the request has, `prefix_matches` how many leading ones
    each pod was already sent (the datastore's prefix memory); only the scorer scheduler reads them.
    `prompt_tokens` is the prompt's size in tokens as estimated from the body (0: unknown), and
    `received_at` when the EPP routes it (the accounting's monotonic clock). `prefills_observed`: the
    response body reaches the EPP on this request's path, so its accounting sees prefills end (first
    response bytes); without that the predicted-TTFT scorer abstains.
    """

    model: str
    target_model: str
    critical: bool
    prefix_blocks: int = 0
    prefix_matches: Mapping[EndpointKey, int] = field(default_factory=lambda: NO_MATCHES)
    prompt_tokens: int = 0
    received_at: float = 0.0
    prefills_observed: bool = True


Pods = list[PodMetrics]
FilterFunc = Callable[[LLMRequest, Pods], Pods]


@dataclass(frozen=True, slots=True)
class FilterNode:
    """One node of the tree. Success means a non-empty output.

    On success the output goes to `on_success` (else `on_success_or_failure`); on failure the
    original input goes to `on_failure` (else `on_success_or_failure`). With no applicable next node
    the node's own output (possibly empty) is the result. (Upstream's nodes carry a name for its
    logs; nothing here logs per node, so the names live in `build_tree`'s comments.)
    """

    func: FilterFunc
    on_success: FilterNode | None = None
    on_failure: FilterNode | None = None
    on_success_or_failure: FilterNode | None = None

    def run(self, request: LLMRequest, pods: Pods) -> Pods:
        node: FilterNode | None = self
        while node is not None:
            out = node.func(request, pods)
            if out:
                node = node.on_success or node.on_success_or_failure
                pods = out
            else:
                node = node.on_failure or node.on_success_or_failure
                if node is None:
                    return out
        return pods


# --- band filters: keep the lowest band; never fail on a non-empty input -------------------------
def least_queuing(_: LLMRequest, pods: Pods) -> Pods:
    """Keep pods with queue in [min, min + (max - min) // n] (integer division, as upstream)."""
    if not pods:
        return []
    queues = [p.metrics.waiting_queue_size for p in pods]
    low = min(queues)
    limit = low + (max(queues) - low) // len(pods)
    return [p for p, q in zip(pods, queues, strict=True) if q <= limit]


def least_kv_cache(_: LLMRequest, pods: Pods) -> Pods:
    """Keep pods with KV usage in [min, min + (max - min) / n] (float division)."""
    if not pods:
        return []
    usage = [p.metrics.kv_cache_usage for p in pods]
    low = min(usage)
    limit = low + (max(usage) - low) / len(pods)
    return [p for p, u in zip(pods, usage, strict=True) if u <= limit]


# --- predicates -----------------------------------------------------------------------------------
def critical_request(request: LLMRequest, pods: Pods) -> Pods:
    """Pass everything for a Critical request; fail (empty) otherwise."""
    return pods if request.critical else []


def low_queueing(threshold: int) -> FilterFunc:
    def low_queueing(_: LLMRequest, pods: Pods) -> Pods:
        return [p for p in pods if p.metrics.waiting_queue_size < threshold]

    return low_queueing


def has_capacity_for_sheddable(queue_threshold: int, kv_threshold: float) -> FilterFunc:
    """Pods with room for a request that may be shed: queue and KV both at or under the thresholds."""

    def has_capacity(_: LLMRequest, pods: Pods) -> Pods:
        return [
            p
            for p in pods
            if p.metrics.waiting_queue_size <= queue_threshold and p.metrics.kv_cache_usage <= kv_threshold
        ]

    return has_capacity


def lora_soft_affinity(affinity_threshold: float, rng: random.Random) -> FilterFunc:
    """Prefer pods that already have the adapter, keep some traffic on pods that could load it.

    Affinity = the target is among the pod's running or waiting adapters; available = not affinity
    and a free adapter slot. Both non-empty: affinity with probability `affinity_threshold`, else
    available (spreads a hot adapter over more pods). One empty: the other. Both empty: fail.
    """

    def soft_affinity(request: LLMRequest, pods: Pods) -> Pods:
        target = request.target_model
        affinity: Pods = []
        available: Pods = []
        for p in pods:
            m = p.metrics
            if target in m.active_models or target in m.waiting_models:
                affinity.append(p)
            elif len(m.loaded_adapters) < m.max_active_models:
                available.append(p)
        if affinity and available:
            return affinity if rng.random() < affinity_threshold else available
        return affinity or available

    return soft_affinity
