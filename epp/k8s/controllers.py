"""Wires the watch layer to the reconcilers: an informer, a work queue and a worker per watched kind.

Which kinds depends on the pool group served (`epp.api.generation`): v1 watches InferencePool v1,
the optional InferenceObjective and InferenceModelRewrite, and Pods; v1alpha2 watches InferencePool,
InferenceModel and Pods, as v0.3.0. Scope as upstream from v0.2.0 (#429): pools only in the pool
namespace and only our pool (field selector `metadata.name`), everything else only in the pool
namespace. Every informer event maps to its own object's key in that kind's queue; the reconcilers
do the rest. An optional kind that is absent or forbidden is served without (informer.py).

Readiness is honest (STYLE habit 7): `has_synced` turns true once every informer has listed and the
keys from those lists have been reconciled once, i.e. the datastore reflects the initial state.

Progress is reported for the settle barrier (DESIGN.md §3): per watched kind, `progress()` gives the
newest resourceVersion whose changes have all been received AND reconciled, and whether the kind's
queue is idle. Why the "applied" version is sound, given three facts:
1. the informer calls our handler, which enqueues the key, before it records an event's version
   (informer.py), so every key of every change up to `informer.resource_version` is already queued;
2. a queued key leaves the queue only through a worker, which calls `done` after its reconcile has
   returned (or failed into a retry, which keeps the queue from being idle);
3. everything here runs on one event loop, so a snapshot of (version, idle) is never torn.
Hence whenever the queue is idle, the informer's current version is applied: we record it then
(after each `done`, and at every snapshot), and report the last value recorded.

Reconcilers are built by the `Reconcilers` factories given to the constructor (the production ones
by default). A reconcile may be a coroutine function: its key counts as in flight until it returns.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from epp.api import ObjectReader
from epp.api.generation import OBJECTIVE_LANE, POOL_LANE, REWRITE_LANE, WatchedKind, generation
from epp.api.types import DEFAULT_POOL_GROUP, ModelRewrite, NamespacedName, PodObject
from epp.config import DEFAULT_WATCH_BOOKMARK_INTERVAL
from epp.controller import ObjectiveReconciler, PodReconciler, PoolReconciler, RewriteReconciler
from epp.datastore import Datastore
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.cache_reader import CacheReader, EmptyCache
from epp.k8s.client import PODS, KubeClient, Resource
from epp.k8s.informer import (
    DEFAULT_ABSENT_BACKOFF,
    DEFAULT_RECONNECT_BACKOFF,
    Informer,
    InformerEvent,
    Parse,
    Sleep,
)
from epp.k8s.workqueue import DEFAULT_RETRY_BACKOFF, QueueShutDown, WorkQueue

log = logging.getLogger(__name__)

T = TypeVar("T")

Reconcile = Callable[[NamespacedName], Awaitable[None] | None]
# How each kind's reconcile is built: (what it reads, the store it writes, the pool served) -> reconcile.
ReconcilerFactory = Callable[[ObjectReader, Datastore, NamespacedName], Reconcile]


def _pool_reconciler(reader: ObjectReader, store: Datastore, pool: NamespacedName) -> Reconcile:
    return PoolReconciler(reader, store, pool).reconcile


def _objective_reconciler(reader: ObjectReader, store: Datastore, pool: NamespacedName) -> Reconcile:
    return ObjectiveReconciler(reader, store, pool).reconcile


def _rewrite_reconciler(reader: ObjectReader, store: Datastore, pool: NamespacedName) -> Reconcile:
    return RewriteReconciler(reader, store, pool).reconcile


def _pod_reconciler(reader: ObjectReader, store: Datastore, pool: NamespacedName) -> Reconcile:
    return PodReconciler(reader, store).reconcile


@dataclass(frozen=True)
class Reconcilers:
    """The reconcile function of each kind. Production uses the defaults; a harness that needs a
    deliberately slow or broken EPP passes its own factories here instead of branching in the code."""

    pool: ReconcilerFactory = _pool_reconciler
    objective: ReconcilerFactory = _objective_reconciler
    # InferenceModelRewrite (v1) and InferenceModel (v1alpha2) alike: both are rewrites once parsed.
    rewrite: ReconcilerFactory = _rewrite_reconciler
    pod: ReconcilerFactory = _pod_reconciler


@dataclass(frozen=True)
class WatchProgress:
    """One watched kind, for the debug view: what the watch covers and how far the EPP has got."""

    resource: str  # the API's plural, e.g. "pods"
    namespace: str
    field_selector: str | None
    label_selector: str | None
    received_resource_version: str  # every change up to here is in the cache and its key queued
    applied_resource_version: str  # ... and reconciled ("" until the first idle moment after a list)
    queued: int
    processing: int
    retrying: int
    relists: int = 0  # the resourceVersion was gone (410) and the kind was listed again
    stalled_watches: int = 0  # watches replaced for reading nothing for two bookmark intervals
    optional: bool = False  # served without when absent or forbidden
    available: bool = True  # False while an optional kind is absent (no CRD) or forbidden (RBAC)

    @property
    def idle(self) -> bool:
        return not (self.queued or self.processing or self.retrying)


class Controllers:
    def __init__(
        self,
        client: KubeClient,
        datastore: Datastore,
        pool: NamespacedName,
        *,
        reconnect_backoff: BackoffPolicy = DEFAULT_RECONNECT_BACKOFF,
        retry_backoff: BackoffPolicy = DEFAULT_RETRY_BACKOFF,
        bookmark_interval: float = DEFAULT_WATCH_BOOKMARK_INTERVAL,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        reconcilers: Reconcilers | None = None,
        pool_group: str = DEFAULT_POOL_GROUP,
        absent_backoff: BackoffPolicy = DEFAULT_ABSENT_BACKOFF,
    ) -> None:
        rng = rng or random.Random()
        build = reconcilers or Reconcilers()
        served = generation(pool_group)
        ns = pool.namespace

        def informer(
            resource: Resource, parse: Parse[T], field_selector: str | None = None, optional: bool = False
        ) -> Informer[T]:
            return Informer(
                client,
                resource,
                ns,
                parse,
                field_selector=field_selector,
                backoff=reconnect_backoff,
                bookmark_interval=bookmark_interval,
                sleep=sleep,
                rng=rng,
                optional=optional,
                absent_backoff=absent_backoff,
            )

        def kind_informer(kind: WatchedKind, field_selector: str | None = None) -> Informer[Any]:
            resource = Resource(kind.group, kind.version, kind.plural)
            return informer(resource, kind.parse, field_selector=field_selector, optional=kind.optional)

        pools = kind_informer(served.pool, field_selector=f"metadata.name={pool.name}")
        rules = [(kind.lane, kind_informer(kind)) for kind in served.rules]
        pods = informer(PODS, PodObject.from_api)
        by_lane = dict(rules)
        reader = CacheReader(
            pools,
            by_lane.get(REWRITE_LANE) or _no_objects(),
            pods,
            objectives=by_lane.get(OBJECTIVE_LANE),
        )

        def queue(kind: str) -> WorkQueue[NamespacedName]:
            return WorkQueue(kind, backoff=retry_backoff, rng=rng)

        factories = {POOL_LANE: build.pool, OBJECTIVE_LANE: build.objective, REWRITE_LANE: build.rewrite}
        self._lanes = [
            _Lane("pool", pools, queue("pool"), build.pool(reader, datastore, pool)),
            *(_Lane(lane, inf, queue(lane), factories[lane](reader, datastore, pool)) for lane, inf in rules),
            _Lane("pod", pods, queue("pod"), build.pod(reader, datastore, pool)),
        ]
        self._synced = asyncio.Event()
        self._started = False

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def progress(self) -> Sequence[WatchProgress]:
        """A snapshot per watched kind (pools, objectives/rewrites or models, pods), taken on the
        event loop (never torn)."""
        return tuple(lane.progress() for lane in self._lanes)

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


def _no_objects() -> EmptyCache[ModelRewrite]:
    return EmptyCache()


class _Lane:
    """One kind: its informer feeds keys to its queue; one worker reconciles them one at a time."""

    def __init__(
        self, kind: str, informer: Informer[Any], queue: WorkQueue[NamespacedName], reconcile: Reconcile
    ) -> None:
        self.kind = kind
        self.informer = informer
        self.queue = queue
        self.reconcile = reconcile
        self._applied = ""
        informer.add_handler(self._enqueue)

    def _enqueue(self, event: InformerEvent[Any]) -> None:
        self.queue.add(event.key)

    def _note_if_idle(self) -> None:
        # Idle now means every key queued so far is reconciled, and the informer queued every key up
        # to its version before recording it: that version is applied (module docstring).
        if self.queue.idle and self.informer.has_synced:
            self._applied = self.informer.resource_version

    def progress(self) -> WatchProgress:
        self._note_if_idle()
        informer, queue = self.informer, self.queue
        return WatchProgress(
            resource=informer.resource.plural,
            namespace=informer.namespace,
            field_selector=informer.field_selector,
            label_selector=informer.label_selector,
            received_resource_version=informer.resource_version,
            applied_resource_version=self._applied,
            queued=len(queue),
            processing=queue.processing,
            retrying=queue.retrying,
            relists=informer.relists,
            stalled_watches=informer.stalled_watches,
            optional=informer.optional,
            available=informer.available,
        )

    async def work(self) -> None:
        """Success forgets the key's failures; an exception retries it with backoff."""
        while True:
            try:
                key = await self.queue.get()
            except QueueShutDown:
                return
            try:
                outcome = self.reconcile(key)
                if outcome is not None:
                    await outcome
            except Exception:
                attempt = self.queue.num_requeues(key) + 1
                log.exception("%s reconcile of %s failed (attempt %d); will retry", self.kind, key, attempt)
                self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)
            finally:
                self.queue.done(key)
                self._note_if_idle()
