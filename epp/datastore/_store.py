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

from epp.api.types import InferenceModel, InferencePool, NamespacedName, PodObject
from epp.datastore._prefix import PrefixIndex
from epp.datastore.types import Dispatched, Metrics, Pod, PodMetrics

if TYPE_CHECKING:
    # Only for annotations: epp.datastore imports this module to export new_datastore.
    from epp.datastore import Datastore, PodLifecycleListener

log = logging.getLogger(__name__)

# What `_put_pod` did to a pod, i.e. what the lifecycle listener must hear.
_ADDED, _MOVED, _UNCHANGED = "added", "moved", "unchanged"


DEFAULT_PREFIX_CAPACITY_PER_POD = 32768


class _Store:
    def __init__(self, listener: PodLifecycleListener | None, prefix_capacity_per_pod: int) -> None:
        # One lock guards _pool, _models, _pods, _in_flight and _prefixes together, so a clear() or a
        # resync is atomic for readers. It is never held while calling out (listener, logging of other
        # objects).
        self._lock = threading.Lock()
        self._pool: InferencePool | None = None
        # modelName -> the object that currently owns it (smallest `claim_order` wins).
        self._models: dict[str, InferenceModel] = {}
        self._pods: dict[NamespacedName, PodMetrics] = {}
        # The handlers' routing memory: requests in flight per pod and target model (mirrored into
        # each PodMetrics.dispatched snapshot), and the prompt prefixes routed to each pod.
        self._in_flight: dict[NamespacedName, collections.Counter[str]] = {}
        self._prefixes = PrefixIndex(prefix_capacity_per_pod)
        self._listener = listener

    # --- pool ---------------------------------------------------------------------------------
    def pool_set(self, pool: InferencePool) -> None:
        with self._lock:
            self._pool = pool

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
            self._models.clear()
            self._pods.clear()
            self._in_flight.clear()
            self._prefixes.clear()
        for key in removed:
            self._notify(self._removed, key)

    # --- models -------------------------------------------------------------------------------
    def model_set_if_older(self, model: InferenceModel) -> bool:
        with self._lock:
            # modelName is immutable (CEL) in v1alpha2; should it change anyway, the object no longer
            # claims its old name and must not stay routable under it.
            for name in [n for n, m in self._models.items() if m.key == model.key and n != model.model_name]:
                del self._models[name]
            existing = self._models.get(model.model_name)
            if (
                existing is not None
                and existing.key != model.key
                and existing.claim_order < model.claim_order
            ):
                # Another object owns the name and comes first in the one ownership order.
                return False
            self._models[model.model_name] = model
            return True

    def model_get(self, model_name: str) -> InferenceModel | None:
        with self._lock:
            return self._models.get(model_name)

    def model_delete(self, key: NamespacedName) -> InferenceModel | None:
        with self._lock:
            for name, model in self._models.items():
                if model.key == key:
                    del self._models[name]
                    return model
        return None

    def model_get_all(self) -> Sequence[InferenceModel]:
        with self._lock:
            return tuple(self._models.values())

    # --- pods ---------------------------------------------------------------------------------
    def pod_update_or_add(self, pod: PodObject) -> bool:
        with self._lock:
            change = self._put_pod(pod)
        self._tell(change, pod.key)
        return change is _ADDED

    def pod_delete(self, key: NamespacedName) -> None:
        with self._lock:
            removed = self._pods.pop(key, None) is not None
            self._forget_routing(key)
        if removed:
            self._notify(self._removed, key)

    def pod_resync(self, pods: Iterable[PodObject]) -> None:
        wanted = {p.key: p for p in pods if p.routable}
        with self._lock:
            removed = [key for key in self._pods if key not in wanted]
            for key in removed:
                del self._pods[key]
                self._forget_routing(key)
            changes = [(self._put_pod(pod), key) for key, pod in wanted.items()]
        for key in removed:
            self._notify(self._removed, key)
        for change, key in changes:
            self._tell(change, key)

    def pod_get(self, key: NamespacedName) -> PodMetrics | None:
        with self._lock:
            return self._pods.get(key)

    def pod_get_all(self) -> Sequence[PodMetrics]:
        with self._lock:
            return tuple(self._pods.values())

    def pod_update_metrics_if_exist(
        self, key: NamespacedName, metrics: Metrics, address: str | None = None
    ) -> bool:
        with self._lock:
            current = self._pods.get(key)
            if current is None or (address is not None and current.pod.address != address):
                return False
            self._pods[key] = dataclasses.replace(current, metrics=metrics)
            return True

    # --- routing memory (written by the handlers) ----------------------------------------------
    def pod_dispatch_started(self, key: NamespacedName, target_model: str) -> bool:
        with self._lock:
            current = self._pods.get(key)
            if current is None:
                return False
            counts = self._in_flight.setdefault(key, collections.Counter())
            counts[target_model] += 1
            self._pods[key] = dataclasses.replace(current, dispatched=_dispatched(counts))
            return True

    def pod_dispatch_finished(self, key: NamespacedName, target_model: str) -> None:
        with self._lock:
            counts = self._in_flight.get(key)
            if counts is None or counts[target_model] <= 0:
                return  # the pod left (and came back) meanwhile: its old requests no longer count
            counts[target_model] -= 1
            if counts[target_model] == 0:
                del counts[target_model]
            current = self._pods.get(key)
            if current is not None:
                self._pods[key] = dataclasses.replace(current, dispatched=_dispatched(counts))

    def prefix_matches(self, hashes: Sequence[int]) -> Mapping[NamespacedName, int]:
        if not hashes:
            return {}
        with self._lock:
            return self._prefixes.matches(hashes)

    def prefix_record(self, key: NamespacedName, hashes: Sequence[int]) -> None:
        if not hashes:
            return
        with self._lock:
            if key in self._pods:
                self._prefixes.record(key, hashes)

    # --- internals ----------------------------------------------------------------------------
    def _put_pod(self, pod: PodObject) -> str:
        """Caller holds the lock. Replace the address keeping metrics; what changed (`_ADDED`...)."""
        current = self._pods.get(pod.key)
        fresh = Pod(key=pod.key, address=pod.pod_ip)
        if current is None:
            self._pods[pod.key] = PodMetrics(fresh)
            return _ADDED
        if current.pod != fresh:
            self._pods[pod.key] = dataclasses.replace(current, pod=fresh)
            return _MOVED if current.pod.address != fresh.address else _UNCHANGED
        return _UNCHANGED

    def _tell(self, change: str, key: NamespacedName) -> None:
        if change is _ADDED:
            self._notify(self._added, key)
        elif change is _MOVED:
            self._notify(self._moved, key)

    def _forget_routing(self, key: NamespacedName) -> None:
        """Caller holds the lock; the pod left, so its counts and prefixes mean nothing any more."""
        self._in_flight.pop(key, None)
        self._prefixes.forget(key)

    def _added(self, key: NamespacedName) -> None:
        if self._listener is not None:
            self._listener.pod_added(key, self)

    def _moved(self, key: NamespacedName) -> None:
        if self._listener is not None:
            self._listener.pod_moved(key, self)

    def _removed(self, key: NamespacedName) -> None:
        if self._listener is not None:
            self._listener.pod_removed(key)

    @staticmethod
    def _notify(call: Callable[[NamespacedName], None], key: NamespacedName) -> None:
        # The store already changed; one failing listener call must not skip the others (a skipped
        # pod_removed would leak that pod's refresher), so log and carry on.
        try:
            call(key)
        except Exception:
            log.exception("pod lifecycle listener failed for %s", key)


def _dispatched(counts: collections.Counter[str]) -> Dispatched:
    return Dispatched(sum(counts.values()), frozenset(counts))


def new_datastore(
    listener: PodLifecycleListener | None = None,
    *,
    prefix_capacity_per_pod: int = DEFAULT_PREFIX_CAPACITY_PER_POD,
) -> Datastore:
    """An empty store; `listener` hears every pod add/remove (the prober starts/stops refreshers).

    ``prefix_capacity_per_pod`` bounds the routed-prefix memory (block hashes) kept per pod.
    """
    return _Store(listener, prefix_capacity_per_pod)
