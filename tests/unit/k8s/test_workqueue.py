"""WorkQueue: per-key de-duplication, never two workers on one key, per-key retry backoff, shutdown.

Retries are scheduled through an injected `call_later`, so tests fire them by hand.
"""

from __future__ import annotations

import asyncio

import pytest

from epp.k8s.backoff import BackoffPolicy
from epp.k8s.workqueue import QueueShutDown, WorkQueue

from .support import WAIT, ManualTimers, run

NO_JITTER = BackoffPolicy(initial=0.05, maximum=0.3, factor=2.0, jitter=0.0)


def queue(timers: ManualTimers | None = None) -> WorkQueue[str]:
    return WorkQueue("test", backoff=NO_JITTER, call_later=timers or ManualTimers())


def test_repeated_adds_merge_into_one_item() -> None:
    async def main() -> None:
        q = queue()
        for k in ("a", "b", "a", "a", "b"):
            q.add(k)
        assert len(q) == 2
        assert [await q.get(), await q.get()] == ["a", "b"]
        assert len(q) == 0

    run(main)


def test_key_added_while_processing_runs_again_after_done_never_concurrently() -> None:
    async def main() -> None:
        q = queue()
        q.add("a")
        first = await q.get()
        q.add("a")
        q.add("a")
        # A second worker must not get "a" while the first holds it.
        second = asyncio.create_task(q.get(), name="second-worker")
        await asyncio.sleep(0)
        assert not second.done()
        assert len(q) == 0

        q.done(first)

        assert await asyncio.wait_for(second, WAIT) == "a"
        q.done("a")
        assert len(q) == 0

    run(main)


def test_done_without_new_adds_does_not_requeue() -> None:
    async def main() -> None:
        q = queue()
        q.add("a")
        q.done(await q.get())
        assert len(q) == 0
        await asyncio.wait_for(q.wait_idle(), WAIT)

    run(main)


def test_retry_delay_grows_per_key_until_forgotten() -> None:
    async def main() -> None:
        timers = ManualTimers()
        q = queue(timers)
        delays: list[float] = []
        for _ in range(5):
            q.add_rate_limited("a")
            delays.append(timers.timers[-1].delay)
        q.add_rate_limited("b")
        assert delays == [0.05, 0.1, 0.2, 0.3, 0.3]  # capped at the maximum
        assert timers.timers[-1].delay == 0.05  # another key starts from the beginning
        assert q.num_requeues("a") == 5

        q.forget("a")
        q.add_rate_limited("a")
        assert timers.timers[-1].delay == 0.05

    run(main)


def test_retry_adds_the_key_when_its_timer_fires() -> None:
    async def main() -> None:
        timers = ManualTimers()
        q = queue(timers)
        q.add("a")
        key = await q.get()
        q.add_rate_limited(key)  # the reconcile failed
        q.done(key)
        assert len(q) == 0  # not before its delay

        timers.fire_all()

        assert await asyncio.wait_for(q.get(), WAIT) == "a"

    run(main)


def test_a_newer_retry_replaces_the_pending_one() -> None:
    async def main() -> None:
        timers = ManualTimers()
        q = queue(timers)
        q.add_rate_limited("a")
        q.add_rate_limited("a")
        assert [t.cancelled for t in timers.timers] == [True, False]
        timers.fire_all()
        assert len(q) == 1

    run(main)


def test_shutdown_wakes_waiting_workers_and_drops_retries() -> None:
    async def main() -> None:
        timers = ManualTimers()
        q = queue(timers)
        workers = [asyncio.create_task(q.get(), name=f"worker-{i}") for i in range(2)]
        await asyncio.sleep(0)
        q.add_rate_limited("a")

        q.shutdown()

        for worker in workers:
            with pytest.raises(QueueShutDown):
                await asyncio.wait_for(worker, WAIT)
        assert [t.cancelled for t in timers.timers] == [True]
        q.add("b")
        assert len(q) == 0
        with pytest.raises(QueueShutDown):
            await q.get()

    run(main)


def test_cancelled_waiter_passes_its_wakeup_on() -> None:
    async def main() -> None:
        q = queue()
        first = asyncio.create_task(q.get(), name="first")
        second = asyncio.create_task(q.get(), name="second")
        await asyncio.sleep(0)
        q.add("a")  # wakes `first`...
        first.cancel()  # ...which is cancelled before it takes the key
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await asyncio.wait_for(second, WAIT) == "a"

    run(main)


def test_wait_idle_waits_for_processing_to_finish() -> None:
    async def main() -> None:
        q = queue()
        q.add("a")
        idle = asyncio.create_task(q.wait_idle(), name="idle")
        key = await q.get()
        await asyncio.sleep(0)
        assert not idle.done()
        q.done(key)
        await asyncio.wait_for(idle, WAIT)

    run(main)


def test_default_timer_uses_the_running_loop() -> None:
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue("real", backoff=BackoffPolicy(initial=0.001, maximum=0.001, jitter=0.0))
        q.add_rate_limited("a")
        assert await asyncio.wait_for(q.get(), WAIT) == "a"
        q.shutdown()

    run(main)


def test_idle_counts_queued_in_flight_and_retrying_keys_as_work() -> None:
    """`idle` is the settle barrier's "nothing left to do": unlike `wait_idle`, a pending retry is work."""

    async def main() -> None:
        timers = ManualTimers()
        q = queue(timers)
        assert q.idle
        q.add("a")
        assert (len(q), q.processing, q.retrying, q.idle) == (1, 0, 0, False)
        key = await q.get()
        assert (len(q), q.processing, q.retrying, q.idle) == (0, 1, 0, False)
        q.add_rate_limited(key)  # the reconcile failed
        q.done(key)
        assert (len(q), q.processing, q.retrying, q.idle) == (0, 0, 1, False)
        await asyncio.wait_for(q.wait_idle(), WAIT)  # the older notion ignores the retry
        timers.fire_all()
        assert (len(q), q.retrying, q.idle) == (1, 0, False)
        q.done(await q.get())
        assert q.idle

    run(main)


def test_wait_idle_holds_while_another_key_is_queued_or_in_flight() -> None:
    """The settle barrier (`Controllers.run`) waits on this before it says "synced": one key done
    while another is still queued, or still held by a second worker, is not idle."""

    async def main() -> None:
        q = queue()
        q.add("a")
        q.add("b")
        q.done(await q.get())  # "b" still queued
        idle = asyncio.create_task(q.wait_idle(), name="idle")
        await asyncio.sleep(0)
        assert not idle.done()
        b = await q.get()
        q.add("c")
        c = await q.get()
        q.done(b)  # "c" still in flight
        await asyncio.sleep(0)
        assert not idle.done()
        q.done(c)
        await asyncio.wait_for(idle, WAIT)

    run(main)


def test_a_shut_down_queue_names_itself_in_what_it_raises() -> None:
    """A worker that lets QueueShutDown escape must say which queue stopped (one queue per kind)."""

    async def main() -> None:
        q: WorkQueue[str] = WorkQueue("pods", backoff=NO_JITTER, call_later=ManualTimers())
        assert q.name == "pods"
        q.shutdown()
        with pytest.raises(QueueShutDown, match=r"^pods$"):
            await q.get()

    run(main)
