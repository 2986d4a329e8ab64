"""InferenceModel reconciler: oldest creationTimestamp owns a modelName; the next oldest is promoted.

Models are held only while the pool is known, so the datastore never serves a model of a pool
that does not exist (the pool reconciler re-lists them when the pool arrives). Removal is by object
identity (`model_delete(key)`), never by modelName: upstream's NotFound path
deleted key "" (the model stayed routable) and a model moved to another pool evicted whichever object
owned that name (epp-behaviour.md §9.7).
"""

from __future__ import annotations

import logging

from epp.api import InferenceModel, NamespacedName, ObjectReader
from epp.datastore import Datastore

log = logging.getLogger(__name__)


class ModelReconciler:
    def __init__(self, reader: ObjectReader, store: Datastore, pool_key: NamespacedName) -> None:
        self._reader = reader
        self._store = store
        self._pool_key = pool_key

    def reconcile(self, key: NamespacedName) -> None:
        if key.namespace != self._pool_key.namespace:
            return
        model = self._reader.get_model(key)
        if model is None or model.deleting or model.pool_name != self._pool_key.name:
            removed = self._store.model_delete(key)
            if removed is not None:
                log.info("model %s (%s) removed", key, removed.model_name)
                self._promote(removed)
            return
        if not self._store.pool_has_synced():
            # Like pods, models are tracked only while the pool is known: until then none is
            # routable, and the pool's arrival re-lists every model (DESIGN.md §2).
            return
        if not self._store.model_set_if_older(model):
            log.info("model %s: modelName %r is owned by an older object", key, model.model_name)

    def _promote(self, removed: InferenceModel) -> None:
        """Hand the freed modelName to the oldest remaining claimant in our pool, if any."""
        if self._store.pool_get() is None:
            # No pool: nothing is routable, and the pool's arrival re-lists every model.
            return
        claimants = [
            m
            for m in self._reader.list_models(self._pool_key.namespace)
            if m.model_name == removed.model_name
            and m.pool_name == self._pool_key.name
            and not m.deleting
            and m.key != removed.key
        ]
        if claimants:
            winner = min(claimants, key=lambda m: m.claim_order)
            self._store.model_set_if_older(winner)
            log.info("model %s promoted for modelName %r", winner.key, winner.model_name)
