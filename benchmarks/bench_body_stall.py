"""How long a big request body stalls everything else in the EPP: small streams and health probes.

The EPP serves from one event loop. A review measured an 8.6 MiB body stalling every stream and
probe for ~640 ms while it was decoded and re-encoded on that loop. This script starts the EPP (the
`Epp` runner, seeded with a pool, one model whose target differs so the body is rewritten, and three
pods; no API server, no scraping) in a child process, keeps a small ext_proc request and a gRPC
health check going every 10 ms, and sends big bodies one after another. It prints the probes'
latency while big bodies are in flight (max and p99: the stall) and the big requests' own latency.

Run it against this tree and against an older one to compare (the script only uses the `Epp`
runner's long-standing API):

    .venv/bin/python benchmarks/bench_body_stall.py [--mib 8.6] [--bodies 10]
    PYTHONPATH=/path/to/old/tree .venv/bin/python benchmarks/bench_body_stall.py   # before
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
PROBE_PERIOD_S = 0.01
MAX_MESSAGE = 64 * 1024 * 1024


# --- the EPP, in the child ---------------------------------------------------------------------------
async def serve() -> None:
    from prometheus_client import CollectorRegistry

    from epp.api import v1alpha2
    from epp.api.types import PodObject
    from epp.backend.metrics import ScrapeError
    from epp.config import ServerConfig
    from epp.server.runner import Epp

    def build(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": kind, **obj}

    class Seed:
        def __init__(self, store: Any) -> None:
            self._store, self.has_synced = store, False

        async def run(self) -> None:
            meta = {"namespace": "default", "creationTimestamp": "2025-01-01T00:00:00Z"}
            spec = {"selector": {"app": "vllm"}, "targetPortNumber": 8000}
            pool = build("InferencePool", {"metadata": {**meta, "name": "pool"}, "spec": spec})
            self._store.pool_set(v1alpha2.pool_from_api(pool))
            self._store.rewrite_set(v1alpha2.model_from_api(build("InferenceModel", {
                "metadata": {**meta, "name": "chat"},
                "spec": {"modelName": "chat", "criticality": "Critical", "poolRef": {"name": "pool"},
                         "targetModels": [{"name": "chat-lora", "weight": 1}]},
            })))  # fmt: skip
            for i in range(3):
                self._store.pod_update_or_add(PodObject.from_api(build("Pod", {
                    "metadata": {**meta, "name": f"pod-{i}", "labels": {"app": "vllm"}},
                    "status": {"podIP": f"10.0.0.{i + 1}", "phase": "Running",
                               "conditions": [{"type": "Ready", "status": "True"}]},
                })))  # fmt: skip
            self.has_synced = True
            await asyncio.get_running_loop().create_future()

    class NoScrapes:
        async def fetch(self, address: str, port: int) -> str:
            raise ScrapeError("no model servers here")

    names = {f.name for f in dataclasses.fields(ServerConfig)}
    extra = {"debug_port": 0} if "debug_port" in names else {}
    config = ServerConfig(
        pool_name="pool", grpc_port=0, grpc_health_port=0, metrics_port=0, bind_address="127.0.0.1",
        secure_serving=False, **extra,
    )  # fmt: skip
    epp = Epp(config, registry=CollectorRegistry(), controllers=Seed, fetcher=NoScrapes())
    async with epp:
        await epp.wait_ready()
        print(json.dumps({"grpc": epp.grpc_port, "health": epp.health_port}), flush=True)
        await epp.wait()


# --- load and probes, in the parent ------------------------------------------------------------------
def request(body: bytes) -> list[bytes]:
    hmap = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=k, raw_value=v)
            for k, v in ((":method", b"POST"), (":path", b"/v1/chat"))
        ]
    )
    return [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hmap)).SerializeToString(),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)).SerializeToString(),
    ]


async def exchange(channel: grpc.aio.Channel, messages: list[bytes]) -> pb.ProcessingResponse:
    call = channel.stream_stream(PROCESS)()
    reply = b""
    for message in messages:
        await call.write(message)
        reply = await call.read()
    await call.done_writing()
    await call.code()
    parsed = pb.ProcessingResponse.FromString(reply)
    assert parsed.HasField("dynamic_metadata"), parsed  # routed, not refused
    return parsed


@dataclasses.dataclass
class Probes:
    stream_s: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (sent at, latency)
    health_s: list[tuple[float, float]] = dataclasses.field(default_factory=list)


async def probe_loop(
    channel: grpc.aio.Channel, health: grpc.aio.Channel, probes: Probes, stop: asyncio.Event
) -> None:
    small = request(json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).encode())
    stub = health_pb2_grpc.HealthStub(health)

    async def one_stream() -> None:
        start = time.perf_counter()
        await exchange(channel, small)
        probes.stream_s.append((start, time.perf_counter() - start))

    async def one_health() -> None:
        start = time.perf_counter()
        await stub.Check(health_pb2.HealthCheckRequest())
        probes.health_s.append((start, time.perf_counter() - start))

    pending: set[asyncio.Task[None]] = set()
    while not stop.is_set():
        for coro in (one_stream(), one_health()):
            task = asyncio.create_task(coro)
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.sleep(PROBE_PERIOD_S)
    await asyncio.gather(*pending)


def stats_ms(samples: Sequence[float]) -> str:
    if not samples:
        return "no samples"
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    median = statistics.median(ordered)
    return f"max {ordered[-1] * 1e3:7.1f} ms, p99 {p99 * 1e3:6.1f} ms, median {median * 1e3:5.2f} ms"


async def measure(ports: dict[str, int], mib: float, bodies: int) -> None:
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
    ]
    entry = {"role": "user", "content": "Describe the weather in one short sentence."}
    count = int(mib * 1024 * 1024 / len(json.dumps(entry)))
    big = json.dumps({"model": "chat", "messages": [entry] * count, "max_tokens": 8}).encode()
    print(f"big body: {len(big) / 2**20:.1f} MiB of chat messages ({count:,} entries), model rewritten")
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{ports['grpc']}", options=options) as channel,
        grpc.aio.insecure_channel(f"127.0.0.1:{ports['health']}") as health,
    ):
        await exchange(channel, request(big))  # warm-up: the first big body may start a helper process
        quiet, stop = Probes(), asyncio.Event()
        prober = asyncio.create_task(probe_loop(channel, health, quiet, stop))
        await asyncio.sleep(1.0)
        stop.set()
        await prober
        loaded, stop = Probes(), asyncio.Event()
        prober = asyncio.create_task(probe_loop(channel, health, loaded, stop))
        big_s = []
        for _ in range(bodies):
            start = time.perf_counter()
            await exchange(channel, request(big))
            big_s.append(time.perf_counter() - start)
        stop.set()
        await prober
    print(f"probes, no big body in flight  : stream {stats_ms([s for _, s in quiet.stream_s])}")
    print(f"                                 health {stats_ms([s for _, s in quiet.health_s])}")
    print(f"probes, big bodies in flight   : stream {stats_ms([s for _, s in loaded.stream_s])}")
    print(f"                                 health {stats_ms([s for _, s in loaded.health_s])}")
    print(f"big requests ({bodies})              : {stats_ms(big_s)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=8.6)
    parser.add_argument("--bodies", type=int, default=10)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve())
        return 0
    child = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        ports = json.loads(child.stdout.readline())
        import epp

        print(f"EPP from {epp.__file__.rsplit('/epp/', 1)[0]} (pid {child.pid})")
        asyncio.run(measure(ports, args.mib, args.bodies))
    finally:
        child.terminate()
        child.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
