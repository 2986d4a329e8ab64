"""Capped exponential backoff with jitter, shared by the informer (reconnects) and the work queue
(per-key retries). Pure: the caller owns the attempt count, the RNG and the sleeping, so tests
inject all three and never wait for real time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# 2.0 ** 64 already dwarfs any cap; clamping keeps float math from overflowing on long outages.
_MAX_EXPONENT = 64


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    # Each delay is shortened by up to this fraction, so replicas that lost the same API server do
    # not reconnect in lockstep, and a delay never exceeds `maximum`.
    jitter: float = 0.2

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Delay before retry number `attempt` (0 for the first retry)."""
        base = min(self.maximum, self.initial * self.factor ** min(max(attempt, 0), _MAX_EXPONENT))
        return base * (1.0 - self.jitter * rng.random())
