"""InferencePool reconciler: the pool drives everything else in the store.

NotFound or deleting clears the store (pods, objectives, rewrites, pool). A first-seen or re-created
pool, or a selector change, resyncs pods from the cache; a target-ports change is applied by the
store itself when the pool is set (endpoints added, removed or renumbered at once). A (re-)created
pool also re-lists the objectives and rewrites bound to it: `clear()` dropped them and upstream never
brought them back until each happened to change (DESIGN.md §2).
"""

from __future__ import annotations

import logging

from epp.api import InferencePool, NamespacedName, ObjectReader
from epp.datastore import Datastore

log = logging.getLogger(__name__)


class PoolReconciler:
    def __init__(self, reader: ObjectReader, store: Datastore, pool_key: NamespacedName) -> None:
        self._reader = reader
        self._store = store
        self._pool_key = pool_key

    def reconcile(self, key: NamespacedName) -> None:
        if key != self._pool_key:
            # The cache is scoped to our pool by field selector; keep the explicit check anyway.
            log.debug("ignoring pool %s (serving %s)", key, self._pool_key)
            return
        pool = self._reader.get_pool(key)
        if pool is None or pool.deleting:
            log.info("pool %s gone or deleting: clearing the datastore", key)
            self._store.clear()
            return
        old = self._store.pool_get()
        self._store.pool_set(pool)
        if old is None or dict(old.selector) != dict(pool.selector):
            self._resync_pods(pool)
        if old is None:
            self._relist_bound(pool)

    def _resync_pods(self, pool: InferencePool) -> None:
        candidates = self._reader.list_pods(pool.key.namespace, pool.selector)
        # pool.matches also rejects an empty selector, exactly as the pod reconciler does.
        self._store.pod_resync(p for p in candidates if pool.matches(p.labels) and p.routable)
        log.info("pool %s: pods resynced (%d endpoints)", pool.key, len(self._store.pod_get_all()))

    def _relist_bound(self, pool: InferencePool) -> None:
        namespace = pool.key.namespace
        for objective in self._reader.list_objectives(namespace):
            if not objective.deleting and pool.binds(objective.pool_ref):
                self._store.objective_set(objective)
        for rewrite in self._reader.list_rewrites(namespace):
            if not rewrite.deleting and pool.binds(rewrite.pool_ref):
                self._store.rewrite_set(rewrite)
