"""The one Datastore implementation: plain dicts behind one lock, immutable values handed out.

Private on purpose (STYLE habit 1): callers hold a `Datastore` from `new_datastore` and never see
these fields. Every value stored is frozen, so a reader can keep what it got without a copy and a
writer replaces whole values. The pod-lifecycle listener is called after the lock is released, so a
listener may read the store (or start a task that writes metrics) without deadlocking.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from epp.api.types import (
    EndpointKey,
    InferencePool,
    ModelRewrite,
    NamespacedName,
    Objective,
    PodObject,
    RewriteMatch,
    endpoint_key,
)
from epp.datastore._prefix import PrefixIndex
from epp.datastore._rewrites import RewriteIndex
from epp.datastore.types import Dispatched, Metrics, Pod, PodMetrics

if TYPE_CHECKING:
    # Only for annotations: epp.datastore imports this module to export new_datastore.
    from epp.datastore import Datastore, PodLifecycleListener

log = logging.getLogger(__name__)

# What a write did to an endpoint, i.e. what the lifecycle listener must hear.
_ADDED, _MOVED, _REMOVED, _UNCHANGED = "added", "moved", "removed", "unchanged"
Change = tuple[str, EndpointKey]


DEFAULT_PREFIX_CAPACITY_PER_POD = 32768


@dataclasses.dataclass(frozen=True, slots=True)
class _Member:
    """What the store keeps of a member pod to (re)build its endpoints when the pool's ports change."""

    address: str
    labels: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, pod: PodObject) -> _Member:
        return cls(pod.pod_ip, tuple(sorted(pod.labels.items())))


class _Store:
    def __init__(self, listener: PodLifecycleListener | None, prefix_capacity_per_pod: int) -> None:
        # One lock guards every field below together, so a clear() or a resync is atomic for readers.
        # It is never held while calling out (listener, logging of other objects).
        self._lock = threading.Lock()
        self._pool: InferencePool | None = None
        self._objectives: dict[NamespacedName, Objective] = {}
        self._rewrites: dict[NamespacedName, ModelRewrite] = {}
        self._rewrite_index = RewriteIndex()  # rebuilt from _rewrites on every change
        # Pods present (pod -> address), and their endpoints: one per pod and target port.
        self._members: dict[NamespacedName, _Member] = {}
        self._pods: dict[EndpointKey, PodMetrics] = {}
        # The handlers' routing memory: requests in flight per endpoint and target model (mirrored
        # into each PodMetrics.dispatched snapshot), and the prompt prefixes routed to each endpoint.
        self._in_flight: dict[EndpointKey, _Flight] = {}
        self._dispatches = 0  # every dispatch so far, over all pods (Dispatched.last)
        self._prefixes = PrefixIndex(prefix_capacity_per_pod)
        self._listener = listener

    # --- pool ---------------------------------------------------------------------------------
    def pool_set(self, pool: InferencePool) -> None:
        with self._lock:
            old = self._pool
            self._pool = pool
            changes: list[Change] = []
            if old is None or old.target_ports != pool.target_ports:
                # The endpoints follow the ports at once: new ranks added, gone ranks removed
                # (upstream #2306 kept them), renumbered ranks moved.
                for pod, member in self._members.items():
                    changes += self._put_endpoints(pod, member)
        self._tell_all(changes)

    def pool_get(self) -> InferencePool | None:
        with self._lock:
            return self._pool

    def pool_has_synced(self) -> bool:
        with self._lock:
            return self._pool is not None

    def pool_labels_match(self, labels: dict[str, str]) -> bool:
        with self._lock:
            pool = self._pool
        return pool is not None and pool.matches(labels)

    def clear(self) -> None:
        with self._lock:
            removed = list(self._pods)
            self._pool = None
            self._objectives.clear()
            self._rewrites.clear()
            self._rewrite_index = RewriteIndex()
            self._members.clear()
            self._pods.clear()
            self._in_flight.clear()
            self._prefixes.clear()
        for key in removed:
            self._notify(self._removed, key)

    # --- objectives ---------------------------------------------------------------------------
    def objective_set(self, objective: Objective) -> None:
        with self._lock:
            self._objectives[objective.key] = objective

    def objective_delete(self, key: NamespacedName) -> Objective | None:
        with self._lock:
            return self._objectives.pop(key, None)

    def objective_get(self, name: str) -> Objective | None:
        with self._lock:
            pool = self._pool
            if pool is None:
                return None
            return self._objectives.get(NamespacedName(pool.key.namespace, name))

    def objective_get_all(self) -> Sequence[Objective]:
        with self._lock:
            return tuple(self._objectives.values())

    # --- rewrites -----------------------------------------------------------------------------
    def rewrite_set(self, rewrite: ModelRewrite) -> None:
        with self._lock:
            if self._rewrites.get(rewrite.key) != rewrite:
                self._rewrites[rewrite.key] = rewrite
                self._rewrite_index = RewriteIndex(self._rewrites.values())

    def rewrite_delete(self, key: NamespacedName) -> ModelRewrite | None:
        with self._lock:
            removed = self._rewrites.pop(key, None)
            if removed is not None:
                self._rewrite_index = RewriteIndex(self._rewrites.values())
            return removed

    def rewrite_match(self, model: str) -> RewriteMatch | None:
        with self._lock:
            index = self._rewrite_index
        return index.match(model)

    def rewrite_get_all(self) -> Sequence[ModelRewrite]:
        with self._lock:
            return tuple(self._rewrites.values())

    def rewrite_get_exact(self) -> Mapping[str, RewriteMatch]:
        with self._lock:
            return self._rewrite_index.exact

    # --- pods ---------------------------------------------------------------------------------
    def pod_update_or_add(self, pod: PodObject) -> bool:
        with self._lock:
            if self._pool is None:
                return False
            new = pod.key not in self._members
            self._members[pod.key] = member = _Member.of(pod)
            changes = self._put_endpoints(pod.key, member)
        self._tell_all(changes)
        return new

    def pod_delete(self, key: NamespacedName) -> None:
        with self._lock:
            self._members.pop(key, None)
            changes = self._drop_endpoints(key, keep=0)
        self._tell_all(changes)

    def pod_resync(self, pods: Iterable[PodObject]) -> None:
        wanted = {p.key: p for p in pods if p.routable}
        with self._lock:
            changes: list[Change] = []
            for key in [k for k in self._members if k not in wanted]:
                del self._members[key]
                changes += self._drop_endpoints(key, keep=0)
            if self._pool is not None:
                for key, pod in wanted.items():
                    self._members[key] = member = _Member.of(pod)
                    changes += self._put_endpoints(key, member)
        self._tell_all(changes)

    def pod_get(self, key: EndpointKey) -> PodMetrics | None:
        with self._lock:
            return self._pods.get(key)

    def pod_get_all(self) -> Sequence[PodMetrics]:
        with self._lock:
            return tuple(self._pods.values())

    def pod_update_metrics_if_exist(
        self, key: EndpointKey, metrics: Metrics, address: str | None = None, port: int | None = None
    ) -> bool:
        with self._lock:
            current = self._pods.get(key)
            if (
                current is None
                or (address is not None and current.pod.address != address)
                or (port is not None and current.pod.port != port)
            ):
                return False
            self._pods[key] = dataclasses.replace(current, metrics=metrics)
            return True

    # --- routing memory (written by the handlers) ----------------------------------------------
    def pod_dispatch_started(
        self, key: EndpointKey, target_model: str, prompt_tokens: int = 0, prefilling: bool = True
    ) -> bool:
        with self._lock:
            current = self._pods.get(key)
            if current is None:
                return False
            flight = self._in_flight.setdefault(key, _Flight())
            flight.counts[target_model] += 1
            tokens = max(prompt_tokens, 0)
            flight.prompt_tokens += tokens
            if prefilling:
                flight.prefill_tokens += tokens
            self._dispatches += 1
            self._pods[key] = dataclasses.replace(current, dispatched=flight.snapshot(self._dispatches))
            return True

    def pod_prefill_done(self, key: EndpointKey, prompt_tokens: int, at: float) -> None:
        with self._lock:
            flight = self._in_flight.get(key)
            current = self._pods.get(key)
            if flight is None or current is None or not flight.counts:
                return  # the pod left (and came back) meanwhile: its old requests no longer count
            flight.prefill_tokens = max(flight.prefill_tokens - max(prompt_tokens, 0), 0)
            flight.prefilled_at = at
            self._pods[key] = dataclasses.replace(
                current, dispatched=flight.snapshot(current.dispatched.last)
            )

    def pod_dispatch_finished(
        self, key: EndpointKey, target_model: str, prompt_tokens: int = 0, prefilled: bool = True
    ) -> None:
        with self._lock:
            flight = self._in_flight.get(key)
            if flight is None or flight.counts[target_model] <= 0:
                return  # the pod left (and came back) meanwhile: its old requests no longer count
            counts = flight.counts
            counts[target_model] -= 1
            if counts[target_model] == 0:
                del counts[target_model]
            tokens = max(prompt_tokens, 0)
            flight.prompt_tokens = max(flight.prompt_tokens - tokens, 0)
            if not prefilled:
                flight.prefill_tokens = max(flight.prefill_tokens - tokens, 0)
            current = self._pods.get(key)
            if current is not None:
                self._pods[key] = dataclasses.replace(
                    current, dispatched=flight.snapshot(current.dispatched.last)
                )

    def prefix_matches(self, hashes: Sequence[int]) -> Mapping[EndpointKey, int]:
        if not hashes:
            return {}
        with self._lock:
            return self._prefixes.matches(hashes)

    def prefix_record(self, key: EndpointKey, hashes: Sequence[int]) -> None:
        if not hashes:
            return
        with self._lock:
            if key in self._pods:
                self._prefixes.record(key, hashes)

    # --- internals ----------------------------------------------------------------------------
    def _put_endpoints(self, pod: NamespacedName, member: _Member) -> list[Change]:
        """Caller holds the lock and a pool is known: the pod's endpoints for the pool's ports.

        Existing ranks keep their metrics (a new address or port is a move); ranks past the pool's
        ports are removed.
        """
        assert self._pool is not None
        ports = self._pool.target_ports
        changes: list[Change] = []
        for rank, port in enumerate(ports):
            key = endpoint_key(pod, rank)
            fresh = Pod(key=key, address=member.address, port=port, labels=member.labels)
            current = self._pods.get(key)
            if current is None:
                self._pods[key] = PodMetrics(fresh)
                changes.append((_ADDED, key))
            elif current.pod != fresh:
                self._pods[key] = dataclasses.replace(current, pod=fresh)
                changes.append((_MOVED, key))
        return changes + self._drop_endpoints(pod, keep=len(ports))

    def _drop_endpoints(self, pod: NamespacedName, keep: int) -> list[Change]:
        """Caller holds the lock: remove the pod's endpoints of rank `keep` and above."""
        gone: list[Change] = []
        rank = keep
        # Ranks are contiguous from 0 (`_put_endpoints` writes them all), so stop at the first gap.
        while (key := endpoint_key(pod, rank)) in self._pods:
            del self._pods[key]
            self._forget_routing(key)
            gone.append((_REMOVED, key))
            rank += 1
        return gone

    def _tell_all(self, changes: Iterable[Change]) -> None:
        for change, key in changes:
            if change is _ADDED:
                self._notify(self._added, key)
            elif change is _MOVED:
                self._notify(self._moved, key)
            elif change is _REMOVED:
                self._notify(self._removed, key)

    def _forget_routing(self, key: EndpointKey) -> None:
        """Caller holds the lock; the endpoint left, so its counts and prefixes mean nothing any more."""
        self._in_flight.pop(key, None)
        self._prefixes.forget(key)

    def _added(self, key: EndpointKey) -> None:
        if self._listener is not None:
            self._listener.pod_added(key, self)

    def _moved(self, key: EndpointKey) -> None:
        if self._listener is not None:
            self._listener.pod_moved(key, self)

    def _removed(self, key: EndpointKey) -> None:
        if self._listener is not None:
            self._listener.pod_removed(key)

    @staticmethod
    def _notify(call: Callable[[EndpointKey], None], key: EndpointKey) -> None:
        # The store already changed; one failing listener call must not skip the others (a skipped
        # pod_removed would leak that pod's refresher), so log and carry on.
        try:
            call(key)
        except Exception:
            log.exception("pod lifecycle listener failed for %s", key)


@dataclasses.dataclass(slots=True)
class _Flight:
    """One endpoint's requests in flight (the lock's to guard), of which ``Dispatched`` is a snapshot."""

    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    prefilled_at: float | None = None

    def snapshot(self, last: int) -> Dispatched:
        return Dispatched(
            sum(self.counts.values()),
            frozenset(self.counts),
            last,
            self.prompt_tokens,
            self.prefill_tokens,
            self.prefilled_at,
        )


def new_datastore(
    listener: PodLifecycleListener | None = None,
    *,
    prefix_capacity_per_pod: int = DEFAULT_PREFIX_CAPACITY_PER_POD,
) -> Datastore:
    """An empty store; `listener` hears every pod add/remove (the prober starts/stops refreshers).

    ``prefix_capacity_per_pod`` bounds the routed-prefix memory (block hashes) kept per pod.
    """
    return _Store(listener, prefix_capacity_per_pod)
