"""Scheduling decision time at 10 / 100 / 1,000 pods (targets: ≤ 50 µs at 100, ≤ 500 µs at 1,000).

Pods carry a realistic spread of queue, KV and LoRA state, all fresh; requests alternate Critical and
Sheddable and name one of a few adapters, so every branch of the tree is exercised. Prints figures,
asserts nothing.

    .venv/bin/python benchmarks/bench_scheduler.py
"""

from __future__ import annotations

import contextlib
import random
import time

from epp.api.types import EndpointKey
from epp.config import SchedulerConfig
from epp.datastore.types import Metrics, Pod, PodMetrics
from epp.errors import EppError
from epp.scheduling import LLMRequest, Scheduler

NOW = 1000.0
ADAPTERS = [f"lora-{i}" for i in range(8)]
TARGETS_US = {100: 50.0, 1000: 500.0}


def make_pods(n: int, rng: random.Random) -> list[PodMetrics]:
    pods = []
    for i in range(n):
        running = frozenset(rng.sample(ADAPTERS, rng.randint(0, 3)))
        pods.append(
            PodMetrics(
                Pod(EndpointKey("default", f"pod-{i}"), f"10.{i // 250}.{i % 250}.1", 8000),
                Metrics(
                    waiting_queue_size=rng.choice([0, 0, 1, 2, 3, 5, 8, 20, 150]),
                    kv_cache_usage=rng.random(),
                    active_models=running,
                    max_active_models=4,
                    updated_at=NOW - rng.random(),
                ),
            )
        )
    return pods


def bench(n: int, rounds: int) -> float:
    rng = random.Random(n)
    pods = make_pods(n, rng)
    requests = [LLMRequest("m", rng.choice(ADAPTERS), critical=i % 2 == 0) for i in range(64)]
    scheduler = Scheduler(SchedulerConfig(), random.Random(1), clock=lambda: NOW)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for i in range(rounds):
            with contextlib.suppress(EppError):
                scheduler.schedule(requests[i & 63], pods)
        best = min(best, (time.perf_counter() - start) / rounds)
    return best * 1e6


def main() -> None:
    print("scheduling decision time (best of 5 runs)")
    for n, rounds in ((10, 20_000), (100, 5_000), (1000, 500)):
        us = bench(n, rounds)
        target = TARGETS_US.get(n)
        note = f"  (target ≤ {target:g} µs)" if target else ""
        print(f"  {n:>5} pods: {us:8.1f} µs/decision{note}")


if __name__ == "__main__":
    main()
