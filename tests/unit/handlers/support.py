"""Shared pieces of the handler tests: a seeded datastore, a scripted scheduler, a live servicer.

The servicer runs on a real server bound to 127.0.0.1:0 (the EPP's own `epp.h2` transport unless a
test asks for grpc.aio) and is driven through a real grpc.aio channel with `ProcessingRequest`
messages, exactly as Envoy drives it. State is seeded
with the datastore's public Protocol methods (allowed in tests/unit).
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import json_format
from prometheus_client import CollectorRegistry

from epp.api import v1, v1alpha2
from epp.api.types import PodObject
from epp.body import BodyScanner
from epp.config import (
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    GRPCIO_TRANSPORT,
    H2_TRANSPORT,
    NO_CONFORMANCE_HOOKS,
    ConformanceHooks,
)
from epp.datastore import Datastore, PodMetrics, new_datastore
from epp.errors import EppError
from epp.h2 import GrpcServer
from epp.handlers import ExtProcServicer, PodScheduler
from epp.handlers.accounting import NO_ACCOUNTING, Accounting
from epp.metrics import RequestMetrics
from epp.scheduling import LLMRequest
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder
from tests.unit.api import objects

DEST = "x-gateway-destination-endpoint"
NS = "default"
POOL_PORT = 8000


class ScriptedScheduler:
    """Ranks the pod named `pick` at rank `pick_rank` first (else the first pod), the others after it
    in their order, or raises `error`; records every request, the candidates it was given and the limit;
    runs `meanwhile` (if set) as it ranks."""

    def __init__(self) -> None:
        self.pick: str | None = None
        self.pick_rank = 0
        self.error: BaseException | None = None
        # Run while ranking: what happens between the candidates' snapshot and the pick's count.
        self.meanwhile: Callable[[], None] | None = None
        self.requests: list[LLMRequest] = []
        self.candidates: list[list[str]] = []
        self.limits: list[int] = []

    def rank(self, request: LLMRequest, pods: Sequence[PodMetrics], limit: int) -> list[PodMetrics]:
        self.requests.append(request)
        self.candidates.append([p.pod.key.name for p in pods])
        self.limits.append(limit)
        if self.meanwhile is not None:
            self.meanwhile()
        if self.error is not None:
            # A fresh exception each time: a stored one would keep its traceback's frames (and with
            # them the gRPC server) alive in a reference cycle after the test.
            raise type(self.error)(*self.error.args)
        first = next(
            (p for p in pods if p.pod.key.name == self.pick and p.pod.key.rank == self.pick_rank), pods[0]
        )
        return [first, *[p for p in pods if p is not first]][: max(1, limit)]


_typed: PodScheduler = ScriptedScheduler()


@dataclass
class Env:
    datastore: Datastore = field(default_factory=new_datastore)
    scheduler: ScriptedScheduler = field(default_factory=ScriptedScheduler)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    # None here and below: the argument is left out, so the servicer's own default applies.
    rng: random.Random | None = field(default_factory=lambda: random.Random(7))
    metadata_namespace: str = "envoy.lb"
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    # None: the servicer makes (and owns) its own; a test that sends big bodies passes one and closes it.
    body_scanner: BodyScanner | None = None
    # Every reading advances the clock a little, so durations are positive and deterministic.
    clock_value: float = 1000.0
    clock_step: float = 0.25
    # The routing memory (in flight per pod, prefixes per pod) in the datastore; off by default.
    accounting: bool = False
    prefix_aware: bool = False
    # The v1 protocol's knobs, as the servicer takes them (its defaults: the pick alone, subset on).
    fallbacks: int = 0
    subset_filter: bool | None = True
    # Upstream's test plugins (off, as without a config naming them).
    conformance: ConformanceHooks = NO_CONFORMANCE_HOOKS
    # The request metrics' class (a test passes one that fails, to see the response still pass).
    request_metrics: Callable[[CollectorRegistry], RequestMetrics] = RequestMetrics
    _servicer: ExtProcServicer | None = None

    def servicer(self) -> ExtProcServicer:
        """One servicer per Env (its metrics register once on the registry)."""
        if self._servicer is None:
            self._servicer = self._build()
        return self._servicer

    def _build(self) -> ExtProcServicer:
        defaulted: dict[str, Any] = {}
        if self.rng is not None:
            defaulted["rng"] = self.rng
        if self.subset_filter is not None:
            defaulted["endpoint_subset_filter"] = self.subset_filter
        return ExtProcServicer(
            self.datastore,
            self.scheduler,
            self.request_metrics(self.registry),
            destination_header_key=DEST,
            metadata_namespace=self.metadata_namespace,
            clock=self._tick,
            max_request_body_bytes=self.max_request_body_bytes,
            body_scanner=self.body_scanner,
            accounting=(
                Accounting(self.datastore, prefix_aware=self.prefix_aware)
                if self.accounting
                else NO_ACCOUNTING
            ),
            destination_fallbacks=self.fallbacks,
            conformance=self.conformance,
            **defaulted,
        )

    def _tick(self) -> float:
        self.clock_value += self.clock_step
        return self.clock_value

    # --- seeding through the public Protocol -----------------------------------------------------
    def pool(self, port: int = POOL_PORT) -> Env:
        self.datastore.pool_set(
            v1alpha2.pool_from_api(PoolBuilder("pool").namespace(NS).selector(app="vllm").port(port).build())
        )
        return self

    def pool_v1(self, *ports: int) -> Env:
        """An InferencePool v1 (any model may be asked for) with these target ports."""
        self.datastore.pool_set(v1.pool_from_api(objects.pool_v1(ns=NS, ports=ports or (POOL_PORT,))))
        return self

    def objective(self, name: str, priority: int | None) -> Env:
        self.datastore.objective_set(v1.objective_from_api(objects.objective(name, priority, ns=NS)))
        return self

    def rewrite(self, name: str, *rules: dict[str, Any], age_s: int = 0) -> Env:
        self.datastore.rewrite_set(v1.rewrite_from_api(objects.rewrite(name, *rules, ns=NS, age_s=age_s)))
        return self

    def model(self, name: str, *targets: tuple[str, int | None], criticality: str | None = None) -> Env:
        builder = ModelBuilder(f"obj-{name}").namespace(NS).model_name(name).pool("pool")
        if criticality:
            builder = builder.criticality(criticality)
        for target, weight in targets:
            builder = builder.target(target, weight=weight)
        self.datastore.rewrite_set(v1alpha2.model_from_api(builder.build()))
        return self

    def pod(self, name: str, ip: str) -> Env:
        obj = PodBuilder(name).namespace(NS).labels(app="vllm").ready(ip).build()
        self.datastore.pod_update_or_add(PodObject.from_api(obj))
        return self

    def sample(self, name: str, labels: Mapping[str, str]) -> float | None:
        return self.registry.get_sample_value(name, dict(labels))


# --- messages ----------------------------------------------------------------------------------
def headers(
    hdrs: Mapping[str, str] | None = None, *, eos: bool = False, response: bool = False
) -> pb.ProcessingRequest:
    if hdrs is None:
        hdrs = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}
    hmap = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs.items()]
    )
    msg = pb.HttpHeaders(headers=hmap, end_of_stream=eos)
    return (
        pb.ProcessingRequest(response_headers=msg) if response else pb.ProcessingRequest(request_headers=msg)
    )


def body(
    data: bytes | Mapping[str, Any], *, eos: bool = True, response: bool = False
) -> pb.ProcessingRequest:
    raw = json.dumps(data).encode() if isinstance(data, Mapping) else data
    msg = pb.HttpBody(body=raw, end_of_stream=eos)
    return pb.ProcessingRequest(response_body=msg) if response else pb.ProcessingRequest(request_body=msg)


# --- driving a live servicer -------------------------------------------------------------------
@asynccontextmanager
async def serving(
    servicer: ExtProcServicer, transport: str = H2_TRANSPORT
) -> AsyncIterator[grpc.aio.Channel]:
    """The servicer on `transport` (`epp.h2`, or grpc.aio for "grpcio"), and a channel to it."""
    if transport == GRPCIO_TRANSPORT:
        aio_server = grpc.aio.server()
        servicer.add_to_server(aio_server)
        port = aio_server.add_insecure_port("127.0.0.1:0")
        await aio_server.start()
        stop: Callable[[], Awaitable[None]] = lambda: aio_server.stop(None)  # noqa: E731
    else:
        h2_server = GrpcServer()
        servicer.add_to_h2_server(h2_server)
        port = await h2_server.start("127.0.0.1", 0)
        stop = lambda: h2_server.stop(None)  # noqa: E731
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close()
        await stop()


@dataclass
class Exchange:
    replies: list[pb.ProcessingResponse]
    code: grpc.StatusCode
    details: str


async def exchange(channel: grpc.aio.Channel, messages: Sequence[pb.ProcessingRequest]) -> Exchange:
    """Envoy's way: send one message, wait for its reply, then the next; stop at an ImmediateResponse."""
    call = pb_grpc.ExternalProcessorStub(channel).Process()
    replies: list[pb.ProcessingResponse] = []
    for message in messages:
        await call.write(message)
        reply = await call.read()
        if reply is grpc.aio.EOF:
            break
        replies.append(reply)
        if reply.HasField("immediate_response"):
            break
    await call.done_writing()
    return Exchange(replies, await call.code(), await call.details())


async def raw_exchange(channel: grpc.aio.Channel, payload: bytes) -> Exchange:
    """Send arbitrary bytes as one message (garbage that no ProcessingRequest decodes from)."""
    method = channel.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process")
    call = method()
    await call.write(payload)
    await call.done_writing()
    replies: list[pb.ProcessingResponse] = []
    try:
        async for reply in call:
            replies.append(pb.ProcessingResponse.FromString(reply))
    except grpc.aio.AioRpcError:
        pass  # the status is read below
    return Exchange(replies, await call.code(), await call.details())


# --- reading replies ---------------------------------------------------------------------------
@dataclass
class Mutation:
    set_headers: frozenset[tuple[str, str]]
    removed: frozenset[str]
    body: bytes | None
    clear_body: bool
    clear_route_cache: bool
    metadata: dict[str, Any]


def common_of(reply: pb.ProcessingResponse) -> Any:
    which = reply.WhichOneof("response")
    assert which is not None, reply
    assert which != "immediate_response", reply
    return getattr(reply, which).response


def mutation(reply: pb.ProcessingResponse) -> Mutation:
    """Headers as a set (their order carries no meaning, upstream #849)."""
    common = common_of(reply)
    hm = common.header_mutation
    return Mutation(
        set_headers=frozenset(
            (o.header.key, o.header.raw_value.decode() or o.header.value) for o in hm.set_headers
        ),
        removed=frozenset(hm.remove_headers),
        body=common.body_mutation.body if common.body_mutation.HasField("body") else None,
        clear_body=common.body_mutation.clear_body,
        clear_route_cache=common.clear_route_cache,
        metadata=json_format.MessageToDict(reply.dynamic_metadata),
    )


def immediate(reply: pb.ProcessingResponse) -> tuple[int, str, dict[str, str]]:
    """(status, the error's message, headers), checking the body is one line of OpenAI-style JSON."""
    assert reply.HasField("immediate_response"), reply
    imm = reply.immediate_response
    hdrs = {o.header.key: o.header.raw_value.decode() for o in imm.headers.set_headers}
    text = imm.body.decode()
    assert "\n" not in text
    error = json.loads(text)["error"]
    assert error["code"] == imm.status.code
    assert error["type"], "the error names its type"
    return int(imm.status.code), str(error["message"]), hdrs


def raise_in_scheduler(env: Env, error: EppError | Exception) -> None:
    env.scheduler.error = error


# Response bodies that carry token usage, as vLLM streams (SSE) or returns (JSON) it.
SSE = (
    b'data: {"choices":[{"text":"Hel"}],"usage":null}\n\n'
    b'data: {"choices":[{"text":"lo"}],"usage":null}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}\n\n'
    b"data: [DONE]\n\n"
)
JSON = json.dumps(
    {"choices": [{"text": "ok"}], "usage": {"prompt_tokens": 5, "completion_tokens": 9}}
).encode()
