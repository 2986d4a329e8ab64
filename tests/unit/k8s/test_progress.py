"""What `Controllers.progress()` reports for the settle barrier: "applied" means received AND reconciled.

A pod reconcile that waits on a gate (an async reconcile, injected through `Reconcilers`) holds a key
in flight for as long as the test wants, so each claim is checked at the moment it matters.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from epp.api import NamespacedName, ObjectReader
from epp.api.types import V1ALPHA2_GROUP
from epp.controller import PodReconciler
from epp.datastore import Datastore, new_datastore
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.client import KubeClient
from epp.k8s.controllers import Controllers, Reconcile, Reconcilers, WatchProgress
from harness.base.eventually import eventually_async

from .fake_apiserver import POD_PATH, FakeApiServer
from .support import WAIT, RecordingSleep, plain_config, run
from .test_controllers import POOL_KEY, pod, populate

FAST_RETRY = BackoffPolicy(initial=0.001, maximum=0.001, jitter=0.0)
# A retry that waits far longer than any test: the failed key stays in backoff ("retrying").
SLOW_RETRY = BackoffPolicy(initial=600.0, maximum=600.0, jitter=0.0)


class GatedPods:
    """A pod reconcile that waits for `open` (or fails while `failing`), then does the real work."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()
        self.failing = False

    def factory(self, reader: ObjectReader, store: Datastore, pool: NamespacedName) -> Reconcile:
        real = PodReconciler(reader, store).reconcile

        async def reconcile(key: NamespacedName) -> None:
            self.entered.set()
            await self.gate.wait()
            if self.failing:
                raise RuntimeError("planted failure")
            real(key)

        return reconcile


@dataclass
class Running:
    server: FakeApiServer
    store: Datastore
    controllers: Controllers
    pods: GatedPods

    def pods_progress(self) -> WatchProgress:
        [progress] = [p for p in self.controllers.progress() if p.resource == "pods"]
        return progress


@asynccontextmanager
async def running(
    retry_backoff: BackoffPolicy = FAST_RETRY, bookmark_interval: float = 60.0
) -> AsyncIterator[Running]:
    async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
        populate(server)
        store = new_datastore()
        gated = GatedPods()
        controllers = Controllers(
            client,
            store,
            POOL_KEY,
            pool_group=V1ALPHA2_GROUP,
            sleep=RecordingSleep(),
            retry_backoff=retry_backoff,
            bookmark_interval=bookmark_interval,
            reconcilers=Reconcilers(pod=gated.factory),
        )
        task = asyncio.create_task(controllers.run(), name="controllers")
        try:
            await asyncio.wait_for(controllers.wait_synced(), WAIT)
            yield Running(server, store, controllers, gated)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


def test_after_sync_every_kind_is_idle_at_the_list_version_with_its_scope() -> None:
    async def main() -> None:
        async with running() as r:
            listed = str(r.server.rv)
            report = {p.resource: p for p in r.controllers.progress()}
            assert set(report) == {"inferencepools", "inferencemodels", "pods"}
            for progress in report.values():
                assert progress.idle, progress
                assert progress.namespace == "ns1"
                assert progress.received_resource_version == progress.applied_resource_version == listed
            assert report["inferencepools"].field_selector == "metadata.name=pool"
            assert report["pods"].field_selector is None
            for progress in report.values():
                assert progress.label_selector is None  # each kind is watched whole, within the namespace
                assert (progress.relists, progress.stalled_watches) == (0, 0)

    run(main)


def test_an_event_is_applied_only_once_its_reconcile_has_returned() -> None:
    async def main() -> None:
        async with running() as r:
            before = r.pods_progress().applied_resource_version
            r.pods.gate.clear()
            r.pods.entered.clear()
            r.server.upsert(POD_PATH, pod("p3", "10.0.0.3"))
            written = str(r.server.rv)
            await asyncio.wait_for(r.pods.entered.wait(), WAIT)

            held = r.pods_progress()
            assert held.received_resource_version == written
            assert held.applied_resource_version == before, "received is not applied"
            assert (held.processing, held.idle) == (1, False)

            r.pods.gate.set()

            async def applied() -> None:
                now = r.pods_progress()
                assert now.idle, now
                assert now.applied_resource_version == written

            await eventually_async(applied, timeout=WAIT)
            assert "p3" in {pm.pod.key.name for pm in r.store.pod_get_all()}

    run(main)


def test_a_key_waiting_to_be_retried_keeps_the_kind_busy_and_unapplied() -> None:
    async def main() -> None:
        async with running() as r:
            before = r.pods_progress().applied_resource_version
            r.pods.failing = True
            r.server.upsert(POD_PATH, pod("p3", "10.0.0.3"))

            async def failing() -> None:
                now = r.pods_progress()
                assert now.received_resource_version == str(r.server.rv)
                assert now.retrying or now.queued or now.processing, now

            await eventually_async(failing, timeout=WAIT)
            assert not r.pods_progress().idle
            assert r.pods_progress().applied_resource_version == before
            r.pods.failing = False

            async def applied() -> None:
                now = r.pods_progress()
                assert now.idle, now
                assert now.applied_resource_version == str(r.server.rv)

            await eventually_async(applied, timeout=WAIT)

    run(main)


def test_a_kind_whose_only_work_is_a_pending_retry_is_reported_busy() -> None:
    """Nothing queued, nothing in flight, one key waiting out its backoff: not idle, not applied. Both
    halves are needed, each on its own: the settle barrier reads `idle` and the applied version."""

    async def main() -> None:
        async with running(retry_backoff=SLOW_RETRY) as r:
            before = r.pods_progress().applied_resource_version
            r.pods.failing = True
            r.server.upsert(POD_PATH, pod("p3", "10.0.0.3"))

            async def backing_off() -> WatchProgress:
                now = r.pods_progress()
                assert (now.queued, now.processing, now.retrying) == (0, 0, 1), now
                return now

            now = await eventually_async(backing_off, timeout=WAIT)
            assert not now.idle, now
            assert now.applied_resource_version == before, now

    run(main)


def test_a_bookmark_moves_an_idle_kind_on() -> None:
    async def main() -> None:
        async with running() as r:
            mark = str(r.server.bookmark(POD_PATH))

            async def moved() -> None:
                now = r.pods_progress()
                assert now.applied_resource_version == mark, now

            await eventually_async(moved, timeout=WAIT)

    run(main)


def test_a_relist_after_410_sets_the_applied_version_from_the_list() -> None:
    async def main() -> None:
        async with running() as r:
            r.server.upsert(POD_PATH, pod("p3", "10.0.0.3"), record=False)  # missed by the watch ...
            r.server.compact(POD_PATH)  # ... which then gets 410 Gone and relists

            async def relisted() -> None:
                now = r.pods_progress()
                assert now.idle, now
                assert now.applied_resource_version == str(r.server.rv)
                assert "p3" in {pm.pod.key.name for pm in r.store.pod_get_all()}
                assert (now.relists, now.stalled_watches) == (1, 0)  # what the debug view shows

            await eventually_async(relisted, timeout=WAIT)

    run(main)


def test_a_watch_replaced_as_dead_is_counted_in_its_kind_s_progress() -> None:
    """What the debug view shows as stalledWatches: here no watch ever gets a bookmark, so each one
    is replaced after two intervals of silence, and each kind counts its own."""

    async def main() -> None:
        async with running(bookmark_interval=0.2) as r:  # idle limit 0.4 s

            async def counted() -> None:
                report = r.controllers.progress()
                assert all(p.stalled_watches >= 1 for p in report), report
                assert all(p.relists == 0 for p in report), report

            await eventually_async(counted, timeout=WAIT)

    run(main)
