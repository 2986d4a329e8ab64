"""An asyncio work queue with client-go's guarantees, for level-based reconcilers.

- A key is queued at most once however many events arrive for it (events merge).
- A key is never handed to two workers at once: added while being processed, it is marked dirty and
  queued again only when the worker calls `done`, so it is re-run after, with the newest state.
- `add_rate_limited` re-adds a failed key after a per-key exponential delay; `forget` resets it.
- `idle` is true only when nothing is queued, nothing is being processed and no key waits in retry
  backoff: the state in which every key added so far has been handled (the settle barrier's "idle").

Delays are scheduled through an injectable `call_later` (default: the running loop's), so the queue
owns no tasks and tests fire retries by hand.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from epp.k8s.backoff import BackoffPolicy

K = TypeVar("K", bound=Hashable)

DEFAULT_RETRY_BACKOFF = BackoffPolicy(initial=0.05, maximum=30.0, factor=2.0, jitter=0.1)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], Cancellable]


class QueueShutDown(Exception):
    """Raised by `get` once the queue is shut down: the worker should return."""


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str,
        *,
        backoff: BackoffPolicy = DEFAULT_RETRY_BACKOFF,
        call_later: CallLater | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self._backoff = backoff
        self._call_later = call_later
        self._rng = rng or random.Random()
        # All state below is touched only from the event loop thread; no lock needed.
        self._queue: deque[K] = deque()  # keys ready to hand out, each at most once
        self._dirty: set[K] = set()  # keys that need processing (queued, or re-added while processing)
        self._processing: set[K] = set()  # keys a worker holds between get() and done()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, Cancellable] = {}
        self._getters: deque[asyncio.Future[None]] = deque()
        self._idle = asyncio.Event()
        self._idle.set()
        self._shut_down = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: K) -> None:
        if self._shut_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # re-queued by done()
        self._push(key)

    def add_rate_limited(self, key: K) -> None:
        """Re-add `key` after its backoff delay (which grows with each failure until `forget`)."""
        if self._shut_down:
            return
        attempt = self._failures.get(key, 0)
        self._failures[key] = attempt + 1
        delay = self._backoff.delay(attempt, self._rng)
        previous = self._timers.pop(key, None)
        if previous is not None:
            previous.cancel()
        call_later = self._call_later or asyncio.get_running_loop().call_later
        self._timers[key] = call_later(delay, lambda: self._retry(key))

    def forget(self, key: K) -> None:
        """The key succeeded: its next failure starts from the initial delay again."""
        self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> K:
        """Wait for a key; the caller must call `done(key)` when finished with it."""
        while not self._queue:
            if self._shut_down:
                raise QueueShutDown(self.name)
            waiter = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._getters:
                    self._getters.remove(waiter)
                elif self._queue:
                    self._wake_one()  # we were woken for a key we will not take: pass it on
                raise
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty and not self._shut_down:
            self._push(key)
        elif not self._queue and not self._processing:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Until nothing is queued or processing (pending retries do not count)."""
        await self._idle.wait()

    @property
    def processing(self) -> int:
        """Keys a worker holds (between `get` and `done`)."""
        return len(self._processing)

    @property
    def retrying(self) -> int:
        """Keys waiting out a retry backoff before they are queued again."""
        return len(self._timers)

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing in flight, nothing waiting to be retried.

        Unlike `wait_idle`, a pending retry counts as work: a key whose reconcile failed has not been
        applied yet, so a caller asking "has everything added so far been handled?" must hear no.
        """
        return not self._queue and not self._processing and not self._timers

    def shutdown(self) -> None:
        """Stop handing out keys, drop pending retries and wake every waiting `get` to raise."""
        self._shut_down = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._queue.clear()
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        self._idle.set()

    def _retry(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _push(self, key: K) -> None:
        self._queue.append(key)
        self._idle.clear()
        self._wake_one()

    def _wake_one(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
