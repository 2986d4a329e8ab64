"""Wires the watch layer to the reconcilers: three informers, three work queues, three workers.

Scope as upstream from v0.2.0 (#429): pools only in the pool namespace and only our pool (field
selector `metadata.name`), models and pods only in the pool namespace. Every informer event maps to
its own object's key in that kind's queue; the reconcilers do the rest.

Readiness is honest (STYLE habit 7): `has_synced` turns true once every informer has listed and the
keys from those lists have been reconciled once, i.e. the datastore reflects the initial state.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any, TypeVar

from epp.api.types import InferenceModel, InferencePool, NamespacedName, PodObject
from epp.controller import ModelReconciler, PodReconciler, PoolReconciler
from epp.datastore import Datastore
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.cache_reader import CacheReader
from epp.k8s.client import (
    DEFAULT_WATCH_TIMEOUT,
    INFERENCE_MODELS,
    INFERENCE_POOLS,
    PODS,
    KubeClient,
    Resource,
)
from epp.k8s.informer import DEFAULT_RECONNECT_BACKOFF, Informer, InformerEvent, Parse, Sleep
from epp.k8s.workqueue import DEFAULT_RETRY_BACKOFF, QueueShutDown, WorkQueue

log = logging.getLogger(__name__)

T = TypeVar("T")

Reconcile = Callable[[NamespacedName], None]


class Controllers:
    def __init__(
        self,
        client: KubeClient,
        datastore: Datastore,
        pool: NamespacedName,
        *,
        reconnect_backoff: BackoffPolicy = DEFAULT_RECONNECT_BACKOFF,
        retry_backoff: BackoffPolicy = DEFAULT_RETRY_BACKOFF,
        watch_timeout: float = DEFAULT_WATCH_TIMEOUT,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        rng = rng or random.Random()
        ns = pool.namespace

        def informer(resource: Resource, parse: Parse[T], field_selector: str | None = None) -> Informer[T]:
            return Informer(
                client,
                resource,
                ns,
                parse,
                field_selector=field_selector,
                backoff=reconnect_backoff,
                watch_timeout=watch_timeout,
                sleep=sleep,
                rng=rng,
            )

        pools = informer(INFERENCE_POOLS, InferencePool.from_api, field_selector=f"metadata.name={pool.name}")
        models = informer(INFERENCE_MODELS, InferenceModel.from_api)
        pods = informer(PODS, PodObject.from_api)
        reader = CacheReader(pools, models, pods)

        def queue(kind: str) -> WorkQueue[NamespacedName]:
            return WorkQueue(kind, backoff=retry_backoff, rng=rng)

        self._lanes = [
            _Lane("pool", pools, queue("pool"), PoolReconciler(reader, datastore, pool).reconcile),
            _Lane("model", models, queue("model"), ModelReconciler(reader, datastore, pool).reconcile),
            _Lane("pod", pods, queue("pod"), PodReconciler(reader, datastore).reconcile),
        ]
        self._synced = asyncio.Event()
        self._started = False

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    async def run(self) -> None:
        """Watch and reconcile until cancelled; cancelling stops and awaits every task started here."""
        if self._started:
            raise RuntimeError("Controllers.run() may be called only once")
        self._started = True
        try:
            async with asyncio.TaskGroup() as group:
                for lane in self._lanes:
                    group.create_task(lane.informer.run(), name=f"epp-informer-{lane.kind}")
                # Workers start only on full caches, so no reconcile acts on a half-listed world.
                for lane in self._lanes:
                    await lane.informer.wait_synced()
                for lane in self._lanes:
                    group.create_task(lane.work(), name=f"epp-worker-{lane.kind}")
                for lane in self._lanes:
                    await lane.queue.wait_idle()
                self._synced.set()
                log.info("controllers synced")
        finally:
            for lane in self._lanes:
                lane.queue.shutdown()


class _Lane:
    """One kind: its informer feeds keys to its queue; one worker reconciles them one at a time."""

    def __init__(
        self, kind: str, informer: Informer[Any], queue: WorkQueue[NamespacedName], reconcile: Reconcile
    ) -> None:
        self.kind = kind
        self.informer = informer
        self.queue = queue
        self.reconcile = reconcile
        informer.add_handler(self._enqueue)

    def _enqueue(self, event: InformerEvent[Any]) -> None:
        self.queue.add(event.key)

    async def work(self) -> None:
        """Success forgets the key's failures; an exception retries it with backoff."""
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            try:
                self.reconcile(key)
            except Exception:
                attempt = self.queue.num_requeues(key) + 1
                log.exception("%s reconcile of %s failed (attempt %d); will retry", self.kind, key, attempt)
                self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)
            finally:
                self.queue.done(key)
