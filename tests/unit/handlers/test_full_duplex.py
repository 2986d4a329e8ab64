"""FULL_DUPLEX_STREAMED, as Envoy streams it: every message sent without waiting, on both transports.

In this mode the request side gets nothing back until the body is complete; then the headers reply
(the routing decision) and the body itself in `streamed_response` chunks. The same decisions as
BUFFERED must come out: model splice with its Content-Length, the client's hint removed, bodyless
requests routed from their headers, readable 413/404.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.config import GRPCIO_TRANSPORT, H2_TRANSPORT
from epp.handlers.responses import STREAMED_CHUNK_BYTES

from .support import DEST, Env, Exchange, body, headers, immediate, mutation, serving

TRANSPORTS = [H2_TRANSPORT, GRPCIO_TRANSPORT]


def duplex_headers(hdrs: dict[str, str] | None = None, *, eos: bool = False) -> pb.ProcessingRequest:
    message = headers(hdrs, eos=eos)
    message.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    return message


def routed_env(*targets: tuple[str, int | None]) -> Env:
    return Env().pool().model("food-review", *targets).pod("pod-1", "10.0.0.1")


async def streamed(channel: grpc.aio.Channel, messages: list[pb.ProcessingRequest]) -> Exchange:
    """Envoy's full duplex way: every message at once, then every reply until the stream ends."""

    async def requests() -> AsyncIterator[pb.ProcessingRequest]:
        for message in messages:
            yield message

    call = pb_grpc.ExternalProcessorStub(channel).Process(requests())
    replies = [reply async for reply in call]
    return Exchange(replies, await call.code(), await call.details())


def run(env: Env, transport: str, *messages: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
    async def scenario() -> list[pb.ProcessingResponse]:
        async with serving(env.servicer(), transport) as channel:
            result = await streamed(channel, list(messages))
            assert result.code == grpc.StatusCode.OK, result.details
            return result.replies

    return asyncio.run(scenario())


def streamed_body(replies: list[pb.ProcessingResponse]) -> tuple[bytes, list[bool]]:
    """The body handed back, put together, and each chunk's end_of_stream."""
    chunks = [r.request_body.response.body_mutation.streamed_response for r in replies]
    return b"".join(c.body for c in chunks), [c.end_of_stream for c in chunks]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_split_body_is_answered_once_with_the_route_and_the_spliced_body(transport: str) -> None:
    env = routed_env(("food-review-lora", None))
    sent = '{"prompt": "crème brûlée",  "model" : "food-review", "max_tokens": 100}'.encode()
    hint = {":method": "POST", ":path": "/v1/completions", DEST: "6.6.6.6:22"}
    replies = run(env, transport, duplex_headers(hint), body(sent[:20], eos=False), body(sent[20:]))
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    routing = mutation(replies[0])
    expected = sent.replace(b'"food-review"', b'"food-review-lora"')
    assert routing.set_headers == {(DEST, "10.0.0.1:8000"), ("content-length", str(len(expected)))}
    assert routing.removed == {DEST}
    assert routing.metadata == {"envoy.lb": {DEST: "10.0.0.1:8000"}}
    assert streamed_body(replies[1:]) == (expected, [True])
    labels = {"model_name": "food-review", "target_model_name": "food-review-lora"}
    assert env.sample("inference_model_request_total", labels) == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_big_body_comes_back_in_chunks_that_envoy_accepts(transport: str) -> None:
    prompt = "x" * (2 * STREAMED_CHUNK_BYTES)
    sent = json.dumps({"model": "food-review", "prompt": prompt}).encode()
    replies = run(routed_env(), transport, duplex_headers(), body(sent))
    assert replies[0].WhichOneof("response") == "request_headers"
    whole, ends = streamed_body(replies[1:])
    assert whole == sent
    assert ends == [False, False, True]
    assert all(
        len(r.request_body.response.body_mutation.streamed_response.body) <= STREAMED_CHUNK_BYTES
        for r in replies[1:]
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_trailers_end_the_body_and_are_answered_after_it(transport: str) -> None:
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    sent = json.dumps({"model": "food-review", "prompt": "hi"}).encode()
    replies = run(routed_env(), transport, duplex_headers(), body(sent, eos=False), trailers)
    kinds = [r.WhichOneof("response") for r in replies]
    assert kinds == ["request_headers", "request_body", "request_trailers"]
    assert streamed_body(replies[1:2]) == (sent, [False])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_body_in_pieces_ended_by_trailers_goes_on_whole(transport: str) -> None:
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    sent = json.dumps({"model": "food-review", "prompt": "hi there"}).encode()
    pieces = [body(sent[:9], eos=False), body(sent[9:20], eos=False), body(sent[20:], eos=False)]
    replies = run(routed_env(), transport, duplex_headers(), *pieces, trailers)
    assert [r.WhichOneof("response") for r in replies] == [
        "request_headers",
        "request_body",
        "request_trailers",
    ]
    assert streamed_body(replies[1:2]) == (sent, [False])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bodyless_request_is_routed_from_its_headers(transport: str) -> None:
    get = {":method": "GET", ":path": "/v1/models", DEST: "6.6.6.6:22"}
    replies = run(routed_env(), transport, duplex_headers(get, eos=True))
    assert [r.WhichOneof("response") for r in replies] == ["request_headers"]
    routing = mutation(replies[0])
    assert (DEST, "10.0.0.1:8000") in routing.set_headers
    assert routing.removed == {DEST}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_too_big_a_body_is_refused_with_413_before_it_ends(transport: str) -> None:
    env = routed_env()
    env.max_request_body_bytes = 100
    first = body(b'{"model": "food-review", "prompt": "' + b"x" * 120, eos=False)
    # The body's end is never sent: the 413 must come from the first chunk past the limit.
    replies = run(env, transport, duplex_headers(), first)
    assert len(replies) == 1
    status, message, _ = immediate(replies[0])
    assert status == 413
    assert "limit of 100 bytes" in message


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unknown_model_is_404_with_a_readable_message(transport: str) -> None:
    replies = run(routed_env(), transport, duplex_headers(), body({"model": "nope"}))
    assert len(replies) == 1
    status, message, _ = immediate(replies[0])
    assert status == 404
    assert "nope" in message


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_body_chunk_after_the_decision_is_not_forwarded(transport: str) -> None:
    # Out of Envoy's order: the body already went back whole, under its Content-Length, when the
    # trailers ended it; a late chunk would make the forwarded body longer than that.
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    sent = json.dumps({"model": "food-review", "prompt": "hi"}).encode()
    replies = run(routed_env(), transport, duplex_headers(), body(sent, eos=False), trailers, body(b"late"))
    kinds = [r.WhichOneof("response") for r in replies]
    assert kinds == ["request_headers", "request_body", "request_trailers"]
    assert streamed_body(replies[1:2]) == (sent, [False])
