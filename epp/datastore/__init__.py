"""The single store of pool, objectives, rewrites and endpoints (DESIGN.md §1, §2), one shape for both
API generations.

An endpoint is (pod, port): a pool with several target ports has one endpoint per pod and port, each
probed and scored alone (`EndpointKey` names the pod and the port's rank). Pods are held only while
the pool is known; a change of the pool's target ports adds or removes endpoints at once (upstream
#2306 kept stale ranks after a shrink). Objectives and rewrites are stored whole; which rewrite rule
decides a model is resolved at lookup (`rewrite_match`), so removing a winner needs no promotion.

Writers: the reconcilers (everything), the per-pod prober (metrics only, and only for pods
still present) and the handlers (their routing memory only: requests in flight per pod, and which
prompt prefixes went where). Readers: scheduler, handlers, collectors and the debug view, through
immutable snapshots. The implementation is private (`epp.datastore._store`); construct it with
`new_datastore`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from epp.api.types import (
    EndpointKey,
    InferencePool,
    ModelRewrite,
    NamespacedName,
    Objective,
    PodObject,
    RewriteMatch,
)
from epp.datastore._store import new_datastore
from epp.datastore.types import Dispatched, Metrics, Pod, PodMetrics


class PodLifecycleListener(Protocol):
    """Told when an endpoint enters or leaves the store, so its refresher starts and stops with it.

    Called synchronously from the writer's thread/loop while no datastore lock is held. The store is
    passed on add (as upstream's PodMetricsFactory receives it) so the refresher can write metrics
    back without the two objects having to be wired in a cycle at construction.
    """

    def pod_added(self, key: EndpointKey, store: Datastore) -> None: ...

    def pod_removed(self, key: EndpointKey) -> None: ...

    def pod_moved(self, key: EndpointKey, store: Datastore) -> None:
        """The address or port changed: a scrape of the old one in flight is now meaningless."""
        ...


class Datastore(Protocol):
    # --- pool -------------------------------------------------------------------------------
    def pool_set(self, pool: InferencePool) -> None:
        """Also makes every pod's endpoints follow the pool's target ports (added, removed, renumbered)."""
        ...

    def pool_get(self) -> InferencePool | None: ...

    def pool_has_synced(self) -> bool: ...

    def pool_labels_match(self, labels: dict[str, str]) -> bool:
        """False when no pool is known (upstream #696 dereferenced nil here)."""
        ...

    def clear(self) -> None:
        """Forget pool, objectives, rewrites and pods (pool deleted); stops every refresher."""
        ...

    # --- objectives -------------------------------------------------------------------------
    def objective_set(self, objective: Objective) -> None:
        """Store or replace (by object identity)."""
        ...

    def objective_delete(self, key: NamespacedName) -> Objective | None: ...

    def objective_get(self, name: str) -> Objective | None:
        """By name (what the request header says), in the pool's namespace."""
        ...

    def objective_get_all(self) -> Sequence[Objective]: ...

    # --- rewrites ---------------------------------------------------------------------------
    def rewrite_set(self, rewrite: ModelRewrite) -> None:
        """Store or replace (by object identity); precedence is applied by `rewrite_match`."""
        ...

    def rewrite_delete(self, key: NamespacedName) -> ModelRewrite | None: ...

    def rewrite_match(self, model: str) -> RewriteMatch | None:
        """The rule that decides `model`: Exact over catch-all, then oldest object, then rule order."""
        ...

    def rewrite_get_all(self) -> Sequence[ModelRewrite]: ...

    def rewrite_get_exact(self) -> Mapping[str, RewriteMatch]:
        """Every model named by an exact match, with the rule that wins it (the debug view's models)."""
        ...

    # --- pods -------------------------------------------------------------------------------
    def pod_update_or_add(self, pod: PodObject) -> bool:
        """Insert its endpoints (one per target port) with empty metrics, or update their address
        keeping metrics; True if the pod is new. A no-op while no pool is known."""
        ...

    def pod_delete(self, key: NamespacedName) -> None:
        """Remove the pod with every endpoint of it."""
        ...

    def pod_resync(self, pods: Iterable[PodObject]) -> None:
        """Make the pod set exactly the routable pods given (full resync after a pool change)."""
        ...

    def pod_get(self, key: EndpointKey) -> PodMetrics | None: ...

    def pod_get_all(self) -> Sequence[PodMetrics]:
        """Every endpoint, i.e. one entry per pod and target port."""
        ...

    def pod_update_metrics_if_exist(
        self, key: EndpointKey, metrics: Metrics, address: str | None = None, port: int | None = None
    ) -> bool:
        """The prober's only write; a late scrape never resurrects a deleted endpoint.

        With `address` / `port` (where the scrape went), the write is dropped unless the endpoint is
        still there: a scrape of an old address or port must not pass for fresh metrics.
        """
        ...

    # --- routing memory: the handlers' only writes ------------------------------------------
    def pod_dispatch_started(
        self, key: EndpointKey, target_model: str, prompt_tokens: int = 0, prefilling: bool = True
    ) -> bool:
        """A request for ``target_model`` with a prompt of about ``prompt_tokens`` was routed to the
        endpoint (False: it is gone); ``prefilling``: its prompt counts as prefilling until
        ``pod_prefill_done`` (only when its first response byte will be reported)."""
        ...

    def pod_prefill_done(self, key: EndpointKey, prompt_tokens: int, at: float) -> None:
        """The first response byte of a request routed there came back at ``at`` (monotonic
        seconds): its prompt is prefilled."""
        ...

    def pod_dispatch_finished(
        self, key: EndpointKey, target_model: str, prompt_tokens: int = 0, prefilled: bool = True
    ) -> None:
        """Its response ended (or the stream died), after its first byte (``prefilled``) or before;
        a no-op for an endpoint removed since."""
        ...

    def prefix_matches(self, hashes: Sequence[int]) -> Mapping[EndpointKey, int]:
        """Endpoints holding a prefix of these prompt block hashes, with how many leading blocks."""
        ...

    def prefix_record(self, key: EndpointKey, hashes: Sequence[int]) -> None:
        """The prompt with these block hashes was routed to the endpoint."""
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
