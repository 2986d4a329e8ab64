"""Fuzzing the ext_proc servicer (CI profile): no crash, no 500 for client input, no destination outside
the pool's ready pods, no state left behind. Strategies and properties: `harness.stress.extproc_fuzz`.

One real server on loopback for the whole run, once per transport (the EPP's own `epp.h2`, and
grpc.aio), a grpc.aio channel to it, the real scheduler over three ready pods with fresh metrics,
every case on a fresh stream. `EPP_FUZZ_CASES` sets the number of cases (default 400,
a few seconds); the long profile (≥ 100k cases against a real EPP process, with its memory) is
`benchmarks/fuzz_ext_proc.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, example, given, settings

from epp.api import v1alpha2
from epp.api.types import PodObject
from epp.config import GRPCIO_TRANSPORT, H2_TRANSPORT, SchedulerConfig
from epp.datastore import Metrics, new_datastore
from epp.h2 import GrpcServer, Limits
from epp.handlers import ExtProcServicer, ExtProcStream
from epp.metrics import UNKNOWN_MODEL, RequestMetrics
from epp.scheduling import Scheduler
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder
from harness.stress.extproc_fuzz import (
    FuzzCase,
    FuzzWorld,
    Message,
    Outcome,
    ext_proc_cases,
    run_case,
    violations,
)

CASES = int(os.environ.get("EPP_FUZZ_CASES", "400"))
NOW = 1000.0
PODS = {"pod-1": "10.0.0.1", "pod-2": "10.0.0.2", "pod-3": "10.0.0.3"}
# modelName → (criticality, targets)
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "chat": ("Critical", ("chat-a", "chat-b")),
    "direct": ("Standard", ()),
    "lora": ("Critical", ("lora-1",)),
    "batch": ("Sheddable", ("chat-a",)),
}
WORLD = FuzzWorld(
    models={name: frozenset(targets or (name,)) for name, (_, targets) in MODELS.items()},
    endpoints=frozenset(f"{ip}:8000" for ip in PODS.values()),
)


def servicer_and_registry() -> tuple[ExtProcServicer, RequestMetrics, object]:
    from prometheus_client import CollectorRegistry

    store = new_datastore()
    store.pool_set(v1alpha2.pool_from_api(PoolBuilder("pool").selector(app="vllm").port(8000).build()))
    for name, (criticality, targets) in MODELS.items():
        builder = ModelBuilder(f"obj-{name}").model_name(name).pool("pool").criticality(criticality)
        for target in targets:
            builder = builder.target(target, weight=10)
        store.rewrite_set(v1alpha2.model_from_api(builder.build()))
    for i, (name, ip) in enumerate(sorted(PODS.items())):
        store.pod_update_or_add(PodObject.from_api(PodBuilder(name).labels(app="vllm").ready(ip).build()))
        store.pod_update_metrics_if_exist(
            PodObject.from_api(PodBuilder(name).build()).key,
            # Every KV cache nearly full: Critical models are routed, the others shed (429).
            Metrics(waiting_queue_size=i, kv_cache_usage=0.9, updated_at=NOW),
        )
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry)
    rng = random.Random(0)
    scheduler = Scheduler(SchedulerConfig(), rng, clock=lambda: NOW, pool_name="pool")
    servicer = ExtProcServicer(
        store,
        scheduler,
        metrics,
        destination_header_key=WORLD.destination_header,
        metadata_namespace="envoy.lb",
        rng=rng,
        clock=lambda: NOW,
        max_request_body_bytes=512 * 1024,
    )
    return servicer, metrics, registry


def envoy_shaped(body: bytes, *, duplex: bool) -> FuzzCase:
    """A stream as Envoy sends it, in two body chunks: run on every run, whatever the draws.

    The random cases reach a rewritten model in full duplex mode only now and then; these make sure
    each run checks the rewrites (the Content-Length that must follow the longer body) and a body
    that is not JSON, in both modes.
    """
    headers = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers={
                "headers": [
                    {"key": ":method", "raw_value": b"POST"},
                    {"key": ":path", "raw_value": b"/v1/completions"},
                ]
            }
        )
    )
    if duplex:
        headers.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    half = len(body) // 2
    bodies = [
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body[:half], end_of_stream=False)),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body[half:], end_of_stream=True)),
    ]
    messages = [Message(m.SerializeToString(), str(m.WhichOneof("request"))) for m in (headers, *bodies)]
    return FuzzCase(tuple(messages), body)


REWRITTEN = b'{"model": "chat", "prompt": "a model name that grows"}'
NOT_JSON = b'{"model": "chat", "prompt": '


class LiveServicer:
    """The servicer on a real server (`transport`) with a channel to it, on one event loop of its own.

    grpc.aio objects belong to the loop they are made on, and grpc's poller thread lives as long as
    any of them does: all are made here and all are dropped by `close()`.
    """

    MAX_MESSAGE = 4 * 1024 * 1024
    OPTIONS = (("grpc.max_receive_message_length", MAX_MESSAGE),)

    def __init__(self, servicer: ExtProcServicer, transport: str) -> None:
        self._servicer = servicer
        self._loop = asyncio.new_event_loop()
        self._grpc: dict[str, Any] = {}
        self._loop.run_until_complete(self._serve(transport))

    async def _serve(self, transport: str) -> None:
        server: Any
        if transport == GRPCIO_TRANSPORT:
            server = grpc.aio.server(options=self.OPTIONS)
            self._servicer.add_to_server(server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
        else:
            server = GrpcServer(limits=Limits(max_message_bytes=self.MAX_MESSAGE))
            self._servicer.add_to_h2_server(server)
            port = await server.start("127.0.0.1", 0)
        self._grpc.update(
            server=server, channel=grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=self.OPTIONS)
        )

    def run(self, case: FuzzCase) -> Outcome:
        return self._loop.run_until_complete(run_case(self._grpc["channel"], case, reply_timeout=20.0))

    def close(self) -> None:
        self._loop.run_until_complete(self._grpc["channel"].close())
        self._loop.run_until_complete(self._grpc["server"].stop(None))
        self._loop.run_until_complete(self._servicer.aclose())
        # grpc.aio's client can leave a call's status task waiting for good when its core failed the
        # messages it still had to send after the server ended the stream (full duplex cases, where
        # every message is sent up front): the client's own tasks, ended with everything else.
        self._loop.run_until_complete(_cancel_leftover_tasks())
        self._loop.close()
        self._grpc.clear()
        gc.collect()


async def _cancel_leftover_tasks() -> None:
    leftovers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in leftovers:
        task.cancel()
    await asyncio.gather(*leftovers, return_exceptions=True)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No automatic garbage collection while a case runs; it resumes between cases.

    A case may parse a body nested thousands deep (the servicer and the oracle both do, on this
    thread). A collection that starts down there runs grpc.aio's finalizers with no stack left:
    they fail, even the report of their failure fails, and grpc's poller thread outlives the test.
    Between cases the stack is shallow, so that is where collections happen.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("transport", [H2_TRANSPORT, GRPCIO_TRANSPORT])
def test_no_stream_of_messages_breaks_the_servicer(transport: str) -> None:
    servicer, _, registry = servicer_and_registry()
    live = LiveServicer(servicer, transport)
    failures: list[str] = []

    @settings(
        max_examples=CASES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=ext_proc_cases(WORLD))
    @example(case=envoy_shaped(REWRITTEN, duplex=True))
    @example(case=envoy_shaped(REWRITTEN, duplex=False))
    @example(case=envoy_shaped(NOT_JSON, duplex=True))
    @example(case=envoy_shaped(NOT_JSON, duplex=False))
    def one_case(case: FuzzCase) -> None:
        with _collector_paused():
            broken = violations(WORLD, case, live.run(case))
        if broken:
            failures.append(f"{case!r}: {broken}")
        assert not broken, broken

    try:
        one_case()
    finally:
        live.close()

    assert failures == []
    # Bounded state: every stream released what it took, labels name only known models.
    samples = [s for family in registry.collect() for s in family.samples]
    assert sum(s.value for s in samples if s.name == "inference_model_running_requests") == 0
    assert {s.labels["model_name"] for s in samples if "model_name" in s.labels} <= {
        *MODELS,
        UNKNOWN_MODEL,
        "",
    }
    gc.collect()
    assert [o for o in gc.get_objects() if isinstance(o, ExtProcStream)] == []
