"""ext_proc throughput: messages per second per core of the EPP's servicer (target ≥ 4,000).

The servicer runs in a separate process so the driver's CPU is not counted; the figure is messages
answered divided by the server process's CPU time (utime + stime from /proc/<pid>/stat). The driver
is a grpc.aio client replaying pre-serialised ProcessingRequest bytes shaped like Envoy 1.40's: request
headers (10 headers, values in raw_value), a ~200 B JSON completion request (BUFFERED body) and
response headers, three messages per HTTP request, many streams in flight. Half the requests name a
model whose target differs, so the body-rewrite path is exercised too. Prints, never asserts.
`--transport` picks the server: the EPP's own `epp.h2` (default) or grpc.aio (`grpcio`).
`--protocol v1` replays the v1 set-up instead (both bodies FULL_DUPLEX_STREAMED, as upstream's test
envoy.yaml), in the six messages Envoy 1.40 sends there (counted under bench_e2e_latency): request
headers, the body and an empty chunk ending it, sent without waiting (two replies back: the routing
headers and the body), then the response headers, a ~300 B JSON completion with usage and an empty
chunk ending it, each answered; every message carries an empty metadata_context, as Envoy's do.
`--profile FILE` writes the server's cProfile stats there.

    .venv/bin/python benchmarks/bench_ext_proc.py [--seconds 10] [--concurrency 32] [--transport grpcio]
        [--protocol buffered|v1] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from epp.api.types import (
    V1ALPHA2_GROUP,
    InferencePool,
    ModelRewrite,
    NamespacedName,
    Objective,
    PodObject,
    PoolRef,
    RewriteRule,
    TargetModel,
    endpoint_key,
)
from epp.config import EXT_PROC_TRANSPORTS, GRPCIO_TRANSPORT, H2_TRANSPORT, SchedulerConfig
from epp.datastore import Datastore, Metrics, new_datastore
from epp.h2 import GrpcServer
from epp.handlers import ExtProcServicer
from epp.metrics import RequestMetrics
from epp.scheduling import Scheduler

METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
PODS = 10
BUFFERED, V1 = "buffered", "v1"
_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


# --- the server process ------------------------------------------------------------------------
def _seeded_store(clock: float) -> Datastore:
    """10 pods with fresh metrics; `llama-3-8b` passes through, `sql-lora` is rewritten to a target."""
    store = new_datastore()
    pool = InferencePool(NamespacedName("default", "pool"), {"app": "vllm"}, (8000,), group=V1ALPHA2_GROUP)
    store.pool_set(pool)
    ref = PoolRef(V1ALPHA2_GROUP, "pool")
    store.rewrite_set(ModelRewrite(NamespacedName("default", "m1"), ref, (RewriteRule(("llama-3-8b",)),)))
    store.rewrite_set(
        ModelRewrite(
            NamespacedName("default", "m3"),
            ref,
            (RewriteRule(("sql-lora",), (TargetModel("sql-lora-v1", 50), TargetModel("sql-lora-v2", 50))),),
            objective=Objective(NamespacedName("default", "m3"), ref, priority=1),
        )
    )
    rng = random.Random(1)
    for i in range(PODS):
        key = NamespacedName("default", f"vllm-{i}")
        store.pod_update_or_add(PodObject(key, {"app": "vllm"}, f"10.0.0.{i + 1}", ready=True))
        key = endpoint_key(key)
        store.pod_update_metrics_if_exist(
            key,
            Metrics(
                waiting_queue_size=rng.randrange(4),
                running_queue_size=rng.randrange(8),
                kv_cache_usage=rng.random() * 0.6,
                active_models=frozenset({"sql-lora-v1"} if i % 2 else set()),
                max_active_models=4,
                updated_at=clock,
            ),
        )
    return store


def bench_servicer(store: Datastore, clock: Callable[[], float], fallbacks: int = 0) -> ExtProcServicer:
    """The servicer as the EPP builds it, over ``store``, seeded RNG, the default scheduler."""
    rng = random.Random(2)
    return ExtProcServicer(
        store,
        Scheduler(SchedulerConfig(), rng, clock),
        RequestMetrics(CollectorRegistry()),
        destination_header_key="x-gateway-destination-endpoint",
        metadata_namespace="envoy.lb",
        rng=rng,
        clock=clock,
        destination_fallbacks=fallbacks,
    )


async def serve(transport: str, profile: str | None) -> None:
    # Fresh metrics forever: the clock the scheduler sees stands still at the scrape time.
    frozen = time.monotonic()
    store = _seeded_store(frozen)
    clock = lambda: frozen  # noqa: E731
    servicer = bench_servicer(store, clock)
    server: Any
    if transport == GRPCIO_TRANSPORT:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        servicer.add_to_server(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
    else:
        server = GrpcServer()
        servicer.add_to_h2_server(server)
        port = await server.start("127.0.0.1", 0)
    print(port, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        loop.add_signal_handler(signal.SIGUSR1, profiler.enable)
    await stop.wait()
    if profiler is not None and profile:
        profiler.disable()
        profiler.dump_stats(profile)
    await server.stop(None)


# --- the driver --------------------------------------------------------------------------------
def _headers(pairs: dict[str, str], response: bool = False) -> bytes:
    hmap = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    )
    msg = pb.HttpHeaders(headers=hmap, end_of_stream=False)
    req = (
        pb.ProcessingRequest(response_headers=msg) if response else pb.ProcessingRequest(request_headers=msg)
    )
    return bytes(req.SerializeToString())


def _with_metadata(message: pb.ProcessingRequest | bytes) -> bytes:
    """The message with the empty metadata_context Envoy 1.40 adds to each one in the v1 set-up."""
    if isinstance(message, bytes):
        message = pb.ProcessingRequest.FromString(message)
    message.metadata_context.SetInParent()
    return bytes(message.SerializeToString())


def captured_requests(protocol: str = BUFFERED) -> list[list[bytes]]:
    """Two request shapes (passthrough and rewrite), each as the messages Envoy sends (module docstring)."""
    request_headers = _headers(
        {
            ":authority": "gateway.example.com:8081",
            ":path": "/v1/completions",
            ":method": "POST",
            ":scheme": "http",
            "content-type": "application/json",
            "content-length": "212",
            "user-agent": "python-requests/2.32.3",
            "accept": "*/*",
            "x-forwarded-proto": "http",
            "x-request-id": "3f0c5b5e-5a7d-4e6e-9d8b-0a8a4c1b2f77",
        }
    )
    response_headers = _headers(
        {":status": "200", "content-type": "application/json", "date": "Sun, 29 Nov 2026 12:00:00 GMT"},
        response=True,
    )
    if protocol == V1:
        req = pb.ProcessingRequest.FromString(request_headers)
        req.protocol_config.request_body_mode = _DUPLEX
        req.protocol_config.response_body_mode = _DUPLEX
        request_headers = bytes(req.SerializeToString())
        completion = {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": "llama-3-8b",
            "choices": [
                {"index": 0, "text": " SELECT id, total FROM orders ORDER BY created_at DESC LIMIT 10;"}
            ],
            "usage": {"prompt_tokens": 17, "completion_tokens": 16, "total_tokens": 33},
        }
        # As Envoy 1.40 sends a full duplex body: the bytes, then an empty chunk that ends the stream;
        # every message carries an (empty) metadata_context.
        response_body = pb.ProcessingRequest(response_body=pb.HttpBody(body=json.dumps(completion).encode()))
        response_end = pb.ProcessingRequest(response_body=pb.HttpBody(end_of_stream=True))
        response_tail = [response_headers, *(_with_metadata(m) for m in (response_body, response_end))]
    else:
        response_tail = [response_headers]
    shapes = []
    for model in ("llama-3-8b", "sql-lora"):
        body = json.dumps(
            {
                "model": model,
                "prompt": "Write a short SQL query that lists the ten most recent orders with their totals.",
                "max_tokens": 128,
                "temperature": 0.2,
                "stream": False,
            }
        ).encode()
        if protocol == V1:
            chunk = pb.ProcessingRequest(request_body=pb.HttpBody(body=body))
            end = pb.ProcessingRequest(request_body=pb.HttpBody(end_of_stream=True))
            request_side = [_with_metadata(request_headers), _with_metadata(chunk), _with_metadata(end)]
        else:
            req = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
            request_side = [request_headers, bytes(req.SerializeToString())]
        shapes.append([*request_side, *response_tail])
    return shapes


async def drive(port: int, seconds: float, concurrency: int, pid: int, protocol: str, profile: bool) -> None:
    shapes = captured_requests(protocol)
    per_request = len(shapes[0])
    # Full duplex: the request headers and the body's first chunk get no reply of their own; the
    # chunk that ends the body gets two (headers, body); each response message one.
    replies_to = {0: 0, 1: 0, 2: 2} if protocol == V1 else {}
    routed_at = 2 if protocol == V1 else 1  # the message whose reply carries the routing decision
    counts = {"messages": 0, "errors": 0, "rejected": 0, "requests": 0}
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    method = channel.stream_stream(METHOD)
    deadline = 0.0

    async def one_request(messages: list[bytes]) -> None:
        call = method()
        for index, message in enumerate(messages):
            await call.write(message)
            counts["messages"] += 1
            for _ in range(replies_to.get(index, 1)):
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    counts["errors"] += 1
                    return
                if index == routed_at and pb.ProcessingResponse.FromString(reply).HasField(
                    "immediate_response"
                ):
                    counts["rejected"] += 1  # the benchmark must measure routing, not rejections
                    return
        await call.done_writing()
        if await call.code() != grpc.StatusCode.OK:
            counts["errors"] += 1
        counts["requests"] += 1

    async def worker(i: int) -> None:
        n = i
        while time.monotonic() < deadline:
            await one_request(shapes[n % len(shapes)])
            n += 1

    # Warm up (imports, first-stream costs, allocator), then measure.
    deadline = time.monotonic() + 1.0
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    counts.update(messages=0, errors=0, rejected=0, requests=0)
    if profile:
        os.kill(pid, signal.SIGUSR1)  # the server profiles the measured part only
    cpu_before, wall_before = server_cpu_seconds(pid), time.monotonic()
    deadline = wall_before + seconds
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    cpu, wall = server_cpu_seconds(pid) - cpu_before, time.monotonic() - wall_before
    await channel.close()
    msgs = counts["messages"]
    print(f"streams in flight      {concurrency}")
    rate = msgs / wall
    requests = counts["requests"]
    print(f"protocol               {protocol} ({per_request} messages per request)")
    print(
        f"messages answered      {msgs} in {wall:.1f} s wall ({rate:,.0f} msg/s, "
        f"{requests / wall:,.0f} req/s)"
    )
    print(f"server CPU             {cpu:.2f} s ({cpu / wall:.0%} of one core)")
    print(
        f"server cost            {cpu / msgs * 1e6:.0f} µs CPU per message, "
        f"{cpu / max(1, requests) * 1e6:.0f} per request"
    )
    print(f"THROUGHPUT             {msgs / cpu:,.0f} messages/s per core (target ≥ 4,000)")
    if counts["errors"] or counts["rejected"]:
        print(f"errors / rejected      {counts['errors']} / {counts['rejected']}")


def server_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of stat(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", default="drive", choices=["drive", "serve"])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--transport", choices=EXT_PROC_TRANSPORTS, default=H2_TRANSPORT)
    parser.add_argument("--protocol", choices=[BUFFERED, V1], default=BUFFERED)
    parser.add_argument("--profile", metavar="FILE", help="write the server's cProfile stats here")
    args = parser.parse_args()
    if args.mode == "serve":
        asyncio.run(serve(args.transport, args.profile))
        return
    print(f"transport: {args.transport}")
    command = [sys.executable, __file__, "serve", "--transport", args.transport]
    if args.profile:
        command += ["--profile", args.profile]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        asyncio.run(
            drive(port, args.seconds, args.concurrency, server.pid, args.protocol, bool(args.profile))
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
