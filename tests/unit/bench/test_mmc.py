"""The virtual-time event loop against queueing theory: an M/M/c queue built on it (Poisson arrivals,
c servers, exponential service, one FIFO queue) must show Erlang C's mean waiting time."""

from __future__ import annotations

import collections
import math
import random

import pytest

from harness.cli.bench.virtual.events import EventLoop


def erlang_c_wait(arrival_rate: float, service_rate: float, servers: int) -> float:
    """Mean time in queue of M/M/c (Erlang C formula)."""
    a = arrival_rate / service_rate
    rho = a / servers
    assert rho < 1
    top = a**servers / math.factorial(servers) / (1 - rho)
    p_wait = top / (sum(a**k / math.factorial(k) for k in range(servers)) + top)
    return p_wait / (servers * service_rate - arrival_rate)


def simulate_mmc(loop: EventLoop, arrival_rate: float, service_rate: float, servers: int, n: int) -> float:
    rng = random.Random(7)
    queue: collections.deque[float] = collections.deque()
    free = [servers]
    waits: list[float] = []

    def start(arrived: float) -> None:
        waits.append(loop.now - arrived)
        free[0] -= 1
        loop.at(loop.now + rng.expovariate(service_rate), depart)

    def depart(_: object) -> None:
        free[0] += 1
        if queue:
            start(queue.popleft())

    def arrive(_: object) -> None:
        if free[0] > 0:
            start(loop.now)
        else:
            queue.append(loop.now)

    t = 0.0
    for _ in range(n):
        t += rng.expovariate(arrival_rate)
        loop.at(t, arrive)
    loop.run()
    warm = waits[n // 10 :]  # the first 10% start from an empty system
    return sum(warm) / len(warm)


@pytest.mark.parametrize(
    ("servers", "load"),
    [pytest.param(1, 0.8, id="M/M/1-at-0.8"), pytest.param(4, 0.85, id="M/M/4-at-0.85"),
     pytest.param(16, 0.9, id="M/M/16-at-0.9")],
)  # fmt: skip
def test_mean_wait_matches_erlang_c(servers: int, load: float) -> None:
    service_rate = 1.0
    arrival_rate = load * servers * service_rate
    measured = simulate_mmc(EventLoop(), arrival_rate, service_rate, servers, 60_000)
    assert measured == pytest.approx(erlang_c_wait(arrival_rate, service_rate, servers), rel=0.08)


def test_events_run_in_time_order_and_ties_in_scheduling_order() -> None:
    loop = EventLoop()
    seen: list[str] = []
    for time, name in ((2.0, "c"), (1.0, "a"), (1.0, "b")):
        loop.at(time, seen.append, name)
    loop.run()
    assert seen == ["a", "b", "c"]
    assert loop.now == 2.0
    with pytest.raises(ValueError, match="in the past"):
        loop.at(1.5, seen.append, "late")
