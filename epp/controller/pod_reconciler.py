"""Pod reconciler: a pod is in the store iff it is in the pool's namespace, matches the selector,
is Ready, has a podIP and no deletionTimestamp (epp-behaviour.md §2.2.6, DESIGN.md §2). The store
makes its endpoints, one per target port of the pool.

Events before any pool are dropped without retry: setting the pool resyncs every pod.
"""

from __future__ import annotations

import logging

from epp.api import NamespacedName, PodReader
from epp.datastore import Datastore

log = logging.getLogger(__name__)


class PodReconciler:
    def __init__(self, reader: PodReader, store: Datastore) -> None:
        self._reader = reader
        self._store = store

    def reconcile(self, key: NamespacedName) -> None:
        pool = self._store.pool_get()
        if pool is None or key.namespace != pool.key.namespace:
            return
        pod = self._reader.get_pod(key)
        if pod is None or not pod.routable or not pool.matches(pod.labels):
            self._store.pod_delete(key)
            return
        if self._store.pod_update_or_add(pod):
            log.debug("pod %s added at %s", key, pod.pod_ip)
