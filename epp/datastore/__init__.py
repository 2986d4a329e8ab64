"""The single store of pool, models and pods (DESIGN.md §2).

Writers: the three reconcilers (everything), the per-pod prober (metrics only, and only for pods
still present) and the handlers (their routing memory only: requests in flight per pod, and which
prompt prefixes went where). Readers: scheduler, handlers, collectors and the debug view, through
immutable snapshots. The implementation is private (`epp.datastore._store`); construct it with
`new_datastore`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from epp.api.types import InferenceModel, InferencePool, NamespacedName, PodObject
from epp.datastore._store import new_datastore
from epp.datastore.types import Dispatched, Metrics, Pod, PodMetrics


class PodLifecycleListener(Protocol):
    """Told when a pod enters or leaves the store, so its refresher starts and stops with it.

    Called synchronously from the writer's thread/loop while no datastore lock is held. The store is
    passed on add (as upstream's PodMetricsFactory receives it) so the refresher can write metrics
    back without the two objects having to be wired in a cycle at construction.
    """

    def pod_added(self, key: NamespacedName, store: Datastore) -> None: ...

    def pod_removed(self, key: NamespacedName) -> None: ...

    def pod_moved(self, key: NamespacedName, store: Datastore) -> None:
        """The pod's address changed: a scrape of the old address in flight is now meaningless."""
        ...


class Datastore(Protocol):
    # --- pool -------------------------------------------------------------------------------
    def pool_set(self, pool: InferencePool) -> None: ...

    def pool_get(self) -> InferencePool | None: ...

    def pool_has_synced(self) -> bool: ...

    def pool_labels_match(self, labels: dict[str, str]) -> bool:
        """False when no pool is known (upstream #696 dereferenced nil here)."""
        ...

    def clear(self) -> None:
        """Forget pool, models and pods (pool deleted); stops every refresher."""
        ...

    # --- models -----------------------------------------------------------------------------
    def model_set_if_older(self, model: InferenceModel) -> bool:
        """Store unless another object owns the modelName and comes first in `claim_order`."""
        ...

    def model_get(self, model_name: str) -> InferenceModel | None: ...

    def model_delete(self, key: NamespacedName) -> InferenceModel | None:
        """Remove the entry stored for this object (by identity, not modelName); return it."""
        ...

    def model_get_all(self) -> Sequence[InferenceModel]: ...

    # --- pods -------------------------------------------------------------------------------
    def pod_update_or_add(self, pod: PodObject) -> bool:
        """Insert with empty metrics or update the address keeping metrics; True if newly added."""
        ...

    def pod_delete(self, key: NamespacedName) -> None: ...

    def pod_resync(self, pods: Iterable[PodObject]) -> None:
        """Make the pod set exactly the routable pods given (full resync after a pool change)."""
        ...

    def pod_get(self, key: NamespacedName) -> PodMetrics | None: ...

    def pod_get_all(self) -> Sequence[PodMetrics]: ...

    def pod_update_metrics_if_exist(
        self, key: NamespacedName, metrics: Metrics, address: str | None = None
    ) -> bool:
        """The prober's only write; a late scrape never resurrects a deleted pod.

        With `address` (where the scrape went), the write is dropped unless the pod is still there:
        a scrape of an old address must not be stored as the pod's fresh metrics.
        """
        ...

    # --- routing memory: the handlers' only writes ------------------------------------------
    def pod_dispatch_started(self, key: NamespacedName, target_model: str) -> bool:
        """A request for ``target_model`` was routed to the pod (False: the pod is gone)."""
        ...

    def pod_dispatch_finished(self, key: NamespacedName, target_model: str) -> None:
        """Its response ended (or the stream died); a no-op for a pod removed since."""
        ...

    def prefix_matches(self, hashes: Sequence[int]) -> Mapping[NamespacedName, int]:
        """Pods holding a prefix of these prompt block hashes, with how many leading blocks."""
        ...

    def prefix_record(self, key: NamespacedName, hashes: Sequence[int]) -> None:
        """The prompt with these block hashes was routed to the pod."""
        ...


__all__ = [
    "Datastore",
    "Dispatched",
    "Metrics",
    "Pod",
    "PodLifecycleListener",
    "PodMetrics",
    "new_datastore",
]
