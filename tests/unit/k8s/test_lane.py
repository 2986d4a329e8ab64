"""One controller lane's worker: a failed reconcile retries with backoff, a success forgets the failures.

The forgetting is what keeps a key that fails now and then from climbing to the maximum delay over a
day of otherwise good reconciles; the lane must forget the key that succeeded, not some other one.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from epp.api import NamespacedName
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.controllers import _Lane
from epp.k8s.informer import Informer
from epp.k8s.workqueue import WorkQueue
from harness.base.eventually import eventually_async

from .support import WAIT, ManualTimers, run

KEY = NamespacedName("ns1", "pool")
INITIAL = 0.05
BACKOFF = BackoffPolicy(initial=INITIAL, maximum=1.0, factor=2.0, jitter=0.0)


class SyncedInformer:
    """What a lane reads of its informer: its handler hook, whether it synced, the version it holds."""

    has_synced = True
    resource_version = "7"

    def add_handler(self, handler: object) -> None:
        self.handler = handler


class ScriptedReconcile:
    """Fails or succeeds per call, as scripted; records every key it was asked for."""

    def __init__(self, outcomes: list[bool]) -> None:
        self.outcomes = outcomes
        self.keys: list[NamespacedName] = []

    def __call__(self, key: NamespacedName) -> None:
        self.keys.append(key)
        if not self.outcomes.pop(0):
            raise RuntimeError(f"scripted failure for {key}")


def test_success_forgets_the_keys_failures_so_its_next_failure_starts_from_the_initial_delay() -> None:
    async def main() -> None:
        timers = ManualTimers()
        queue: WorkQueue[NamespacedName] = WorkQueue("pools", backoff=BACKOFF, call_later=timers)
        reconcile = ScriptedReconcile([False, True, False])
        lane = _Lane("pool", cast(Informer[Any], SyncedInformer()), queue, reconcile)
        worker = asyncio.create_task(lane.work(), name="lane-worker")

        async def retry_scheduled() -> None:
            assert [t.delay for t in timers.timers] == [INITIAL]
            assert queue.idle is False  # a retry waiting is work still to do

        queue.add(KEY)
        await eventually_async(retry_scheduled, timeout=WAIT)
        assert queue.num_requeues(KEY) == 1

        timers.fire_all()  # the retry succeeds

        async def forgotten() -> None:
            assert reconcile.keys == [KEY, KEY]
            assert queue.idle
            assert queue.num_requeues(KEY) == 0

        await eventually_async(forgotten, timeout=WAIT)

        queue.add(KEY)  # the next change fails again: its delay starts over
        await eventually_async(retry_scheduled, timeout=WAIT)

        queue.shutdown()
        await asyncio.wait_for(worker, WAIT)

    run(main)
