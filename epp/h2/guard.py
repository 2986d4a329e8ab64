"""Bookkeeping that keeps one connection's cost bounded: frame-rate budgets and closed streams.

Pure data structures; the connection passes the time in, so they never read a clock themselves.
"""

from __future__ import annotations

import collections
from typing import Final

# How a remembered stream was closed: by the peer (its END_STREAM was seen, or it reset the stream),
# so any further DATA or HEADERS is a STREAM_CLOSED error; or by us (RST_STREAM, trailers before
# the peer finished, a refusal), so frames it sent before hearing of it may still arrive.
CLOSED_BY_PEER: Final = True
CLOSED_BY_US: Final = False


class Rate:
    """A token bucket: ``per_second`` events a second, bursts of up to one second's worth."""

    __slots__ = ("_per_second", "_stamp", "_tokens")

    def __init__(self, per_second: int, now: float) -> None:
        self._per_second = float(per_second)
        self._tokens = float(per_second)
        self._stamp = now

    def spend(self, now: float) -> bool:
        """Take one token; False when the bucket is empty (the peer is over its rate)."""
        tokens = self._tokens + (now - self._stamp) * self._per_second
        self._stamp = now
        if tokens > self._per_second:
            tokens = self._per_second
        if tokens < 1.0:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1.0
        return True


class ClosedStreams:
    """The ``capacity`` most recently closed stream ids and who closed each; older ones are forgotten."""

    __slots__ = ("_capacity", "_closed")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._closed: collections.OrderedDict[int, bool] = collections.OrderedDict()

    def add(self, stream_id: int, by_peer: bool) -> None:
        closed = self._closed
        closed[stream_id] = by_peer
        if len(closed) > self._capacity:
            closed.popitem(last=False)

    def get(self, stream_id: int) -> bool | None:
        """CLOSED_BY_PEER, CLOSED_BY_US, or None when not (or no longer) remembered."""
        return self._closed.get(stream_id)

    def __len__(self) -> int:
        return len(self._closed)
