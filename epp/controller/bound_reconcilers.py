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

from epp.api import NamespacedName, ObjectReader
from epp.datastore import Datastore

log = logging.getLogger(__name__)


class ObjectiveReconciler:
    def __init__(self, reader: ObjectReader, store: Datastore, pool_key: NamespacedName) -> None:
        self._reader = reader
        self._store = store
        self._pool_key = pool_key

    def reconcile(self, key: NamespacedName) -> None:
        if key.namespace != self._pool_key.namespace:
            return
        objective = self._reader.get_objective(key)
        pool = self._store.pool_get()
        if objective is None or objective.deleting or pool is None or not pool.binds(objective.pool_ref):
            if self._store.objective_delete(key) is not None:
                log.info("objective %s removed", key)
            return
        self._store.objective_set(objective)


class RewriteReconciler:
    """InferenceModelRewrite (v1), or InferenceModel (v1alpha2) as the rewrite it converts to."""

    def __init__(self, reader: ObjectReader, store: Datastore, pool_key: NamespacedName) -> None:
        self._reader = reader
        self._store = store
        self._pool_key = pool_key

    def reconcile(self, key: NamespacedName) -> None:
        if key.namespace != self._pool_key.namespace:
            return
        rewrite = self._reader.get_rewrite(key)
        pool = self._store.pool_get()
        if rewrite is None or rewrite.deleting or pool is None or not pool.binds(rewrite.pool_ref):
            if self._store.rewrite_delete(key) is not None:
                log.info("rewrite %s removed", key)
            return
        self._store.rewrite_set(rewrite)
