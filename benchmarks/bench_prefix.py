"""The prefix-aware part of a request's hot path (only with a profile that scores prefixes, e.g.
upstream's default): hashing the prompt into blocks, then asking the routing memory which pods hold
how many of them, at 10 / 100 / 1,000 pods that were each sent the same ~1,200-character system
prompt followed by a question of their own (the worst case for matching: every pod holds the first
18 blocks). CPU time of this thread, fastest of 100 short batches. Prints figures, asserts nothing.

    .venv/bin/python benchmarks/bench_prefix.py
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from epp.api.types import V1ALPHA2_GROUP, InferencePool, NamespacedName, PodObject, endpoint_key
from epp.datastore import Datastore, new_datastore
from epp.scheduling.prefix import block_hashes

SYSTEM = "You are a helpful assistant. " * 40
PROMPT = SYSTEM + "a new question from someone" * 3


def fastest(fn: Callable[[], object], batch: int, batches: int = 100) -> float:
    best = float("inf")
    for _ in range(batches):
        start = time.thread_time()
        for _ in range(batch):
            fn()
        best = min(best, (time.thread_time() - start) / batch)
    return best * 1e6


def seeded(n: int) -> Datastore:
    """`n` ready pods, each sent the system prompt and a question of its own."""
    store = new_datastore(prefix_capacity_per_pod=31250)
    store.pool_set(
        InferencePool(NamespacedName("default", "pool"), {"app": "vllm"}, (8000,), group=V1ALPHA2_GROUP)
    )
    for i in range(n):
        pod = NamespacedName("default", f"pod-{i}")
        store.pod_update_or_add(PodObject(pod, {"app": "vllm"}, f"10.{i // 250}.{i % 250}.1", ready=True))
        store.prefix_record(endpoint_key(pod), block_hashes(SYSTEM + f"user {i} asks something" * 3, "m"))
    return store


def main() -> None:
    print(f"prefix hot path (CPU, fastest of 100 batches; load average {os.getloadavg()[0]:.2f})")
    hashing = fastest(lambda: block_hashes(PROMPT, "m"), 50)
    print(f"  block hashes of a {len(PROMPT)}-character prompt: {hashing:.1f} µs")
    hashes = block_hashes(PROMPT, "m")
    for n in (10, 100, 1000):
        store = seeded(n)
        us = fastest(lambda store=store: store.prefix_matches(hashes), max(1, 2000 // n))  # type: ignore[misc]
        print(f"  prefix matches, {n:>5} pods holding the system prompt: {us:8.1f} µs")


if __name__ == "__main__":
    main()
