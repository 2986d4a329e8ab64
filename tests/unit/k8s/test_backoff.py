"""BackoffPolicy.delay: exponential up to `maximum`, each delay shortened by at most `jitter` of
itself, never lengthened (replicas spread their reconnects, none waits past the maximum)."""

from __future__ import annotations

import random

import pytest

from epp.k8s.backoff import BackoffPolicy

POLICY = BackoffPolicy(initial=0.5, maximum=30.0, factor=2.0, jitter=0.2)


@pytest.mark.parametrize(
    ("attempt", "base"), [(-1, 0.5), (0, 0.5), (1, 1.0), (3, 4.0), (6, 30.0), (500, 30.0)]
)
def test_every_delay_is_within_its_jitter_below_the_base(attempt: int, base: float) -> None:
    rng = random.Random(3)
    delays = [POLICY.delay(attempt, rng) for _ in range(2_000)]
    assert min(delays) >= base * (1 - POLICY.jitter)
    assert max(delays) <= base
    assert max(delays) - min(delays) > base * POLICY.jitter * 0.9, "the jitter spreads the delays"


def test_without_jitter_the_delay_is_the_base() -> None:
    policy = BackoffPolicy(initial=0.5, maximum=30.0, factor=2.0, jitter=0.0)
    assert [policy.delay(a, random.Random(1)) for a in range(4)] == [0.5, 1.0, 2.0, 4.0]
