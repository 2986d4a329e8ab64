"""The ext_proc stream handler alone (`ExtProcStream.handle`, no gRPC, no TLS): CPU per request in
the v1 set-up, the six messages Envoy 1.40 sends there (`bench_ext_proc.captured_requests`), against
its request side alone (what FULL_DUPLEX_STREAMED on the request body costs) and each response-side
message on its own. One pod of a pool whose model passes through, two fallbacks (as the harness
starts the EPP behind `EnvoyOptions.v1`), a clock that moves. Fastest of 5 batches of thread CPU
time. Prints figures, asserts nothing.

    .venv/bin/python benchmarks/bench_stream_handler.py [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from bench_ext_proc import V1, bench_servicer, captured_requests

from epp.api.types import (
    V1ALPHA2_GROUP,
    InferencePool,
    ModelRewrite,
    NamespacedName,
    PodObject,
    PoolRef,
    RewriteRule,
    endpoint_key,
)
from epp.datastore import Metrics, new_datastore
from epp.handlers import ExtProcServicer

NAMES = (
    "request headers",
    "request body",
    "body end (routes)",
    "response headers",
    "response body",
    "response end",
)


def servicer() -> ExtProcServicer:
    store = new_datastore()
    store.pool_set(
        InferencePool(NamespacedName("default", "pool"), {"app": "vllm"}, (8000,), group=V1ALPHA2_GROUP)
    )
    ref = PoolRef(V1ALPHA2_GROUP, "pool")
    store.rewrite_set(ModelRewrite(NamespacedName("default", "m1"), ref, (RewriteRule(("llama-3-8b",)),)))
    key = NamespacedName("default", "vllm-0")
    store.pod_update_or_add(PodObject(key, {"app": "vllm"}, "10.0.0.1", ready=True))
    now = [time.monotonic()]

    def clock() -> float:
        now[0] += 1e-4
        return now[0]

    store.pod_update_metrics_if_exist(endpoint_key(key), Metrics(updated_at=now[0] + 1e6))
    return bench_servicer(store, clock, fallbacks=2)


async def run(
    service: ExtProcServicer, messages: Sequence[bytes], count: int, per_message: list[float]
) -> None:
    for _ in range(count):
        stream = service.new_stream()
        for index, message in enumerate(messages):
            start = time.thread_time()
            _, end = await stream.handle(message)
            per_message[index] += time.thread_time() - start
            if end:
                raise RuntimeError(f"message {index} ended the stream: the benchmark must measure routing")
        stream.close()


def fastest(service: ExtProcServicer, messages: Sequence[bytes], count: int) -> tuple[float, list[float]]:
    asyncio.run(run(service, messages, min(count, 1000), [0.0] * len(messages)))  # warm up
    best, best_split = float("inf"), [0.0] * len(messages)
    for _ in range(5):
        split = [0.0] * len(messages)
        start = time.thread_time()
        asyncio.run(run(service, messages, count, split))
        took = time.thread_time() - start
        if took < best:
            best, best_split = took, split
    return best / count, [t / count for t in best_split]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    v1 = captured_requests(V1)[0]  # the model that passes through
    assert len(v1) == len(NAMES)
    service = servicer()
    request_side, _ = fastest(service, v1[:3], args.requests)
    whole, split = fastest(service, v1, args.requests)
    print(
        f"request side only (FULL_DUPLEX request body, 3 messages)  {request_side * 1e6:6.1f} µs per request"
    )
    print(f"v1 (both bodies full duplex, 6 messages)                  {whole * 1e6:6.1f} µs per request")
    print(f"  of which the response side                              {sum(split[3:]) * 1e6:6.1f} µs")
    for name, took in zip(NAMES, split, strict=True):
        print(f"    {name:<20} {took * 1e6:6.1f} µs (timed around each handle)")


if __name__ == "__main__":
    main()
