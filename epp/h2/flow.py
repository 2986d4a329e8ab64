"""Receive windows: what the peer may still send, and the credit owed back as bytes are consumed.

A window is topped up (one WINDOW_UPDATE of everything owed) once less than half of it is left
to the peer, and only with credit for bytes the server no longer holds: the memory a peer can pin
is what its windows allow, never more. Pure arithmetic; the connection decides what "consumed" means
(see ``epp.h2.connection``).
"""

from __future__ import annotations


class Inbound:
    """One receive window of ``size`` bytes (a stream's or the connection's)."""

    __slots__ = ("available", "owed", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.available = size  # what the peer may still send
        self.owed = 0  # consumed, not yet given back

    def consume(self, n: int) -> int:
        """``n`` received bytes are no longer held; the increment to send now, or 0."""
        self.owed += n
        if self.available >= self.size >> 1 or not self.owed:
            return 0
        increment, self.owed = self.owed, 0
        self.available += increment
        return increment

    @property
    def held(self) -> int:
        """Received and not yet consumed."""
        return self.size - self.available - self.owed
