"""Level-based reconcilers for InferencePool, objectives, rewrites and Pod (epp-behaviour.md §3).

Each is a small object with `reconcile(key) -> None`: it re-reads current state through an
`ObjectReader` (the watch cache) and makes the `Datastore` agree with it. They never talk to the API
server and import only `epp.api` and `epp.datastore`, so unit tests drive them with a dict-backed
reader and a real store. A raised exception means "retry this key later" (the work queue backs off).
They see one shape for both API generations (epp.api.types) and never branch on the generation.
"""

from epp.controller.bound_reconcilers import ObjectiveReconciler, RewriteReconciler
from epp.controller.pod_reconciler import PodReconciler
from epp.controller.pool_reconciler import PoolReconciler

__all__ = ["ObjectiveReconciler", "PodReconciler", "PoolReconciler", "RewriteReconciler"]
