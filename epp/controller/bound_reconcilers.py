"""Objective and rewrite reconcilers: an object is in the store iff it is bound to our pool.

Bound means: in the pool's namespace, not being deleted, and its `poolRef` names the pool's group,
kind and name (upstream #1275 bound by name alone, so the objectives of a v1 pool applied to a
v1alpha2 pool of the same name). Objects are held only while the pool is known: the pool's arrival
re-lists them (DESIGN.md §2). Removal is by object identity, never by the model or name it claims,
and which rewrite wins a model is decided at lookup by the datastore, so the removal of a winner
hands its models to the next oldest claimant without a promotion step (epp-behaviour.md §9.7,
upstream #393).
"""

from __future__ import annotations

import logging
from typing import Generic, Protocol, TypeVar

from epp.api import ModelRewrite, NamespacedName, Objective, ObjectReader, PoolRef
from epp.datastore import Datastore

log = logging.getLogger(__name__)


class _Bound(Protocol):
    """What both kinds carry: whether they are being deleted and which pool they name."""

    @property
    def deleting(self) -> bool: ...
    @property
    def pool_ref(self) -> PoolRef: ...


T = TypeVar("T", bound=_Bound)


class _BoundReconciler(Generic[T]):
    """One kind bound to the pool: read it through the cache, store it while bound, else remove it."""

    kind = ""

    def __init__(self, reader: ObjectReader, store: Datastore, pool_key: NamespacedName) -> None:
        self._reader = reader
        self._store = store
        self._pool_key = pool_key

    def reconcile(self, key: NamespacedName) -> None:
        if key.namespace != self._pool_key.namespace:
            return
        obj = self._read(key)
        pool = self._store.pool_get()
        if obj is None or obj.deleting or pool is None or not pool.binds(obj.pool_ref):
            if self._delete(key):
                log.info("%s %s removed", self.kind, key)
            return
        self._set(obj)

    def _read(self, key: NamespacedName) -> T | None:
        raise NotImplementedError

    def _set(self, obj: T) -> None:
        raise NotImplementedError

    def _delete(self, key: NamespacedName) -> bool:
        raise NotImplementedError


class ObjectiveReconciler(_BoundReconciler[Objective]):
    """InferenceObjective (v1), or the priority an InferenceModel (v1alpha2) implies."""

    kind = "objective"

    def _read(self, key: NamespacedName) -> Objective | None:
        return self._reader.get_objective(key)

    def _set(self, obj: Objective) -> None:
        self._store.objective_set(obj)

    def _delete(self, key: NamespacedName) -> bool:
        return self._store.objective_delete(key) is not None


class RewriteReconciler(_BoundReconciler[ModelRewrite]):
    """InferenceModelRewrite (v1), or InferenceModel (v1alpha2) as the rewrite it converts to."""

    kind = "rewrite"

    def _read(self, key: NamespacedName) -> ModelRewrite | None:
        return self._reader.get_rewrite(key)

    def _set(self, obj: ModelRewrite) -> None:
        self._store.rewrite_set(obj)

    def _delete(self, key: NamespacedName) -> bool:
        return self._store.rewrite_delete(key) is not None
