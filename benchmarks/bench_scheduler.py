"""Scheduling decision time at 10 / 100 / 1,000 pods (targets: ≤ 50 µs at 100, ≤ 500 µs at 1,000),
for three schedulers: the v0.3.0 filter tree, our default scorer scheduler, and upstream v1.5's
default profile (queue 2, KV cache 2, prefix 3, max-score picker) loaded from
examples/config/upstream-default.yaml.

Pods carry a realistic spread of queue, KV and LoRA state, all fresh; requests alternate Critical and
Sheddable, name one of a few adapters, and have 16 prompt blocks of which some pods already hold a
prefix, so every branch of the tree and every scorer is exercised. Times are CPU time of the deciding
thread, the fastest of many short batches (robust to a busy box: preempted batches lose). Prints
figures, asserts nothing.

    .venv/bin/python benchmarks/bench_scheduler.py
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from epp.api.types import EndpointKey
from epp.config import FILTER_TREE, SCORER, ProberConfig, SchedulerConfig, ScorerWeights
from epp.datastore.types import Dispatched, Metrics, Pod, PodMetrics
from epp.errors import EppError
from epp.pickerconfig import load_picker_config
from epp.scheduling import LLMRequest, new_scheduler

UPSTREAM_DEFAULT = Path(__file__).resolve().parents[1] / "examples" / "config" / "upstream-default.yaml"
PROMPT_BLOCKS = 16

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
                _in_flight(rng),
            )
        )
    return pods


def _in_flight(rng: random.Random) -> Dispatched:
    """What this EPP has in flight on a pod: a few requests, some still prefilling, the latest first
    byte a few milliseconds to a second ago (the predicted-TTFT scorer reads all of it)."""
    count = rng.choice([0, 1, 4, 16, 64])
    prompt = count * rng.randint(100, 2000)
    prefilling = rng.choice([0, 0, prompt // max(count, 1)])
    at = NOW - rng.choice([0.001, 0.004, 0.5]) if count else None
    return Dispatched(count, frozenset(), 0, prompt, prefilling, at)


def make_requests(pods: list[PodMetrics], rng: random.Random) -> list[LLMRequest]:
    requests = []
    for i in range(64):
        holders = rng.sample(pods, max(1, len(pods) // 10))
        matches = {p.pod.key: rng.randint(1, PROMPT_BLOCKS) for p in holders}
        requests.append(
            LLMRequest(
                "m",
                rng.choice(ADAPTERS),
                critical=i % 2 == 0,
                prefix_blocks=PROMPT_BLOCKS,
                prefix_matches=matches,
                prompt_tokens=rng.randint(50, 4000),
                received_at=NOW,
            )
        )
    return requests


def schedulers() -> dict[str, SchedulerConfig]:
    upstream = load_picker_config(
        UPSTREAM_DEFAULT.read_text(), scheduler=SchedulerConfig(), prober=ProberConfig()
    ).scheduler
    return {
        "v0.3 filter tree": SchedulerConfig(kind=FILTER_TREE),
        "our default scorers": SchedulerConfig(kind=SCORER),
        "our default scorers without predicted TTFT": SchedulerConfig(
            kind=SCORER, weights=ScorerWeights(predicted_ttft=0.0)
        ),
        "upstream default profile": upstream,
    }


def bench(config: SchedulerConfig, n: int, batch: int, batches: int = 300) -> float:
    """The fastest of `batches` batches of `batch` decisions, in CPU time of this thread per decision:
    on a shared box a batch the OS preempted shows in wall time, not in thread time, and the minimum
    keeps the batches that ran undisturbed (each is ~1 ms)."""
    rng = random.Random(n)
    pods = make_pods(n, rng)
    requests = make_requests(pods, rng)
    scheduler = new_scheduler(config, random.Random(1), clock=lambda: NOW)
    best = float("inf")
    i = 0
    for _ in range(batches):
        start = time.thread_time()
        for _ in range(batch):
            try:  # noqa: SIM105 (entering contextlib.suppress costs a µs, a try nothing)
                scheduler.schedule(requests[i & 63], pods)
            except EppError:
                pass
            i += 1
        best = min(best, (time.thread_time() - start) / batch)
    return best * 1e6


def main() -> None:
    print(f"scheduling decision time (CPU, fastest of 300 batches; load average {os.getloadavg()[0]:.2f})")
    for name, config in schedulers().items():
        print(f"  {name}")
        for n, batch in ((10, 100), (100, 20), (1000, 3)):
            us = bench(config, n, batch)
            target = TARGETS_US.get(n)
            note = f"  (target ≤ {target:g} µs)" if target else ""
            print(f"    {n:>5} pods: {us:8.1f} µs/decision{note}")


if __name__ == "__main__":
    main()
