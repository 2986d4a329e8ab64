"""A discrete-event loop: callbacks at simulated times, run in time order, no wall clock.

Events at the same time run in the order they were scheduled (a sequence number breaks ties), so a
run is deterministic. ``now`` is the time of the event being run; scheduling into the past is an
error (it would make time run backwards).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self) -> None:
        self._queue: list[tuple[float, int, Callable[..., None], Any]] = []
        self._seq = 0
        self.now = 0.0
        self.events = 0

    def at(self, time: float, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Run ``callback(arg)`` at simulated ``time`` (not before ``now``)."""
        if time < self.now:
            raise ValueError(f"an event at {time} is in the past (now {self.now})")
        self._seq += 1
        heapq.heappush(self._queue, (time, self._seq, callback, arg))

    def run(self, until: float = float("inf")) -> None:
        """Run events in time order until none is left or the next is later than ``until``."""
        queue = self._queue
        pop = heapq.heappop
        while queue and queue[0][0] <= until:
            time, _, callback, arg = pop(queue)
            self.now = time
            self.events += 1
            callback(arg)

    @property
    def pending(self) -> int:
        return len(self._queue)
