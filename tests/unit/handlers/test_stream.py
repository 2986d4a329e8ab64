"""`ExtProcStream` without gRPC: the cases a live channel cannot show (no reply expected, addresses)."""

from __future__ import annotations

import asyncio

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.api.types import EndpointKey
from epp.config import ConformanceHooks
from epp.errors import ResourceExhausted
from epp.handlers.stream import ExtProcStream, destination_list

from .support import NS, Env, body, headers


def _stream(env: Env) -> ExtProcStream:
    return env.servicer().new_stream()


def test_observability_mode_records_but_never_replies() -> None:
    env = Env().pool().model("m").pod("pod-1", "10.0.0.1")
    stream = _stream(env)
    first = headers()
    first.observability_mode = True
    second = body({"model": "m"})
    second.observability_mode = True
    assert asyncio.run(stream.handle(first.SerializeToString())) == (None, False)
    assert asyncio.run(stream.handle(second.SerializeToString())) == (None, False)
    assert env.sample("inference_model_request_total", {"model_name": "m", "target_model_name": "m"}) == 1
    stream.close()


def test_body_after_routing_is_continued_unchanged() -> None:
    env = Env().pool().model("m").pod("pod-1", "10.0.0.1")
    stream = _stream(env)
    asyncio.run(stream.handle(headers().SerializeToString()))
    asyncio.run(stream.handle(body({"model": "m"}).SerializeToString()))
    reply, end = asyncio.run(stream.handle(body(b"trailing", eos=True).SerializeToString()))
    assert reply is not None
    assert not end
    assert pb.ProcessingResponse.FromString(reply).WhichOneof("response") == "request_body"
    assert len(env.scheduler.requests) == 1
    stream.close()
    stream.close()  # the running gauge is released once only
    assert env.sample("inference_model_running_requests", {"model_name": "m"}) == 0


@pytest.mark.parametrize(
    ("address", "endpoint"),
    [
        pytest.param("10.1.2.3", "10.1.2.3:8000", id="ipv4"),
        pytest.param("fd00::1", "[fd00::1]:8000", id="ipv6-bracketed"),
    ],
)
def test_endpoint_uses_the_pool_port(address: str, endpoint: str) -> None:
    env = Env().pool().pod("p", address)
    pod = env.datastore.pod_get(EndpointKey(NS, "p"))
    assert pod is not None
    assert destination_list([pod]) == endpoint


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ResourceExhausted("pool saturated"), id="a-refusal"),
        pytest.param(RuntimeError("bug"), id="an-internal-error"),
    ],
)
def test_an_immediate_response_ends_the_stream(error: Exception) -> None:
    """Envoy takes an ImmediateResponse as the stream's last word: the EPP says it is done too."""
    env = Env().pool().model("m").pod("pod-1", "10.0.0.1")
    env.scheduler.error = error
    stream = _stream(env)
    asyncio.run(stream.handle(headers().SerializeToString()))
    reply, end = asyncio.run(stream.handle(body({"model": "m"}).SerializeToString()))
    assert isinstance(reply, bytes)
    assert pb.ProcessingResponse.FromString(reply).HasField("immediate_response")
    assert end
    stream.close()


def test_the_served_endpoint_echo_keeps_the_stream_open_for_the_body() -> None:
    env = (
        Env(conformance=ConformanceHooks(served_endpoint_header=True))
        .pool()
        .model("m")
        .pod("pod-1", "10.0.0.1")
    )
    stream = _stream(env)
    asyncio.run(stream.handle(headers().SerializeToString()))
    asyncio.run(stream.handle(body({"model": "m"}).SerializeToString()))
    response = headers({":status": "200", "content-type": "application/json"}, response=True)
    reply, end = asyncio.run(stream.handle(response.SerializeToString()))
    assert reply is not None
    assert not end, "the response body still has to pass"
    stream.close()


def test_a_content_length_that_is_not_a_number_is_ignored() -> None:
    env = Env().pool().model("m").pod("pod-1", "10.0.0.1")
    stream = _stream(env)
    request = headers({":method": "POST", ":path": "/v1/completions", "content-length": "12abc"})
    assert asyncio.run(stream.handle(request.SerializeToString()))[1] is False
    reply, end = asyncio.run(stream.handle(body({"model": "m"}).SerializeToString()))
    assert isinstance(reply, bytes)
    assert pb.ProcessingResponse.FromString(reply).WhichOneof("response") == "request_body"
    assert not end
    stream.close()
