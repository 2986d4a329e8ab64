"""Full duplex response chunks answered from their bytes (`plain_response_chunk`), as Envoy sends them.

The v1 set-up hands every response chunk back in `streamed_response`. The common message (a chunk
and an empty metadata_context, nothing else) is answered without a protobuf decode or encode; these
tests hold that shortcut to the general path: the same reply bytes as upb builds, the same chunk and
end_of_stream, and, on a whole stream, the same replies, usage and metrics as messages that take the
general path. Anything the shortcut does not understand is left to the decoder.
"""

from __future__ import annotations

import asyncio

import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.handlers.responses import STREAMED_CHUNK_BYTES, streamed_body
from epp.handlers.stream import Reply, plain_response_chunk

from .support import JSON, SSE, Env, body, headers

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
# Sizes either side of each varint length boundary the reply's four nested lengths cross.
SIZES = [
    0,
    1,
    119,
    120,
    127,
    128,
    300,
    16_370,
    16_383,
    16_384,
    STREAMED_CHUNK_BYTES - 1,
    STREAMED_CHUNK_BYTES,
]


def chunk_message(data: bytes, eos: bool, *, envoy_metadata: bool = True) -> pb.ProcessingRequest:
    """A response chunk; Envoy 1.40 adds an empty metadata_context to every message."""
    message = body(data, eos=eos, response=True)
    if envoy_metadata:
        message.metadata_context.SetInParent()
    return message


def payload(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


@pytest.mark.parametrize("envoy_metadata", [True, False], ids=["envoy-metadata", "bare"])
@pytest.mark.parametrize("eos", [True, False], ids=["end", "more"])
@pytest.mark.parametrize("size", SIZES)
def test_the_reply_is_byte_for_byte_the_one_upb_builds(size: int, eos: bool, envoy_metadata: bool) -> None:
    data = payload(size)
    raw = chunk_message(data, eos, envoy_metadata=envoy_metadata).SerializeToString()
    assert plain_response_chunk(raw) == (data, eos, streamed_body(data, eos, phase="response_body")[0])


def _other_metadata() -> pb.ProcessingRequest:
    message = chunk_message(b"data", True)
    message.metadata_context.filter_metadata["envoy.lb"].fields["x"].string_value = "y"
    return message


def _metadata_then(message: pb.ProcessingRequest) -> pb.ProcessingRequest:
    message.metadata_context.filter_metadata["envoy.lb"].fields["x"].string_value = "y"
    return message


def test_a_chunk_with_forwarded_metadata_needs_no_decoder_either() -> None:
    """Envoy forwards `envoy.lb` (the served endpoint) on every response message; on a chunk nothing
    in it matters, so the chunk still takes the shortcut, with the same reply."""
    data = payload(300)
    message = _other_metadata()
    message.response_body.body = data
    message.response_body.end_of_stream = False
    raw = message.SerializeToString()
    assert plain_response_chunk(raw) == (data, False, streamed_body(data, False, phase="response_body")[0])


def _observability() -> pb.ProcessingRequest:
    message = chunk_message(b"data", True)
    message.observability_mode = True
    return message


def _observability_without_metadata() -> pb.ProcessingRequest:
    message = chunk_message(b"data", True, envoy_metadata=False)
    message.observability_mode = True
    return message


def _without_message() -> pb.ProcessingRequest:
    message = chunk_message(b"data", True)
    message.response_body.end_of_stream_without_message = True
    return message


def _with_protocol_config() -> pb.ProcessingRequest:
    message = chunk_message(b"data", True)
    message.protocol_config.response_body_mode = FULL_DUPLEX
    return message


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(
            chunk_message(payload(STREAMED_CHUNK_BYTES + 1), True).SerializeToString(), id="over-64KiB"
        ),
        pytest.param(_metadata_then(_observability()).SerializeToString(), id="metadata-then-observability"),
        pytest.param(_observability().SerializeToString(), id="observability-mode"),
        pytest.param(
            _observability_without_metadata().SerializeToString(),
            id="observability-mode-right-after-the-body",
        ),
        pytest.param(_without_message().SerializeToString(), id="end-of-stream-without-message"),
        pytest.param(_with_protocol_config().SerializeToString(), id="protocol-config"),
        pytest.param(headers({":status": "200"}, response=True).SerializeToString(), id="response-headers"),
        pytest.param(body(b"data", response=False).SerializeToString(), id="request-body"),
        pytest.param(b"\x2a\x04\x0a\x00\x10\x01", id="empty-body-written-out"),
        pytest.param(b"\x2a\x02\x10\x00", id="end-of-stream-false-written-out"),
        pytest.param(b"\x2a\x06\x0a\x09abc", id="body-longer-than-its-message"),
        pytest.param(b"\x2a\x05\x0a\x09abc", id="body-longer-than-a-message-that-fits-the-bytes"),
        pytest.param(b"\x2a\x09\x0a\x03abc", id="message-longer-than-the-bytes"),
        pytest.param(b"\x2a\xff\xff\xff\xff\xff\xff", id="length-never-ends"),
        pytest.param(b"\x2a\x80", id="length-cut-short"),
        pytest.param(b"\x2a\x05\x0a\x03abc\x42\x80", id="metadata-length-cut-short"),
        pytest.param(b"", id="empty"),
    ],
)
def test_what_needs_a_decoder_is_left_to_it(raw: bytes) -> None:
    assert plain_response_chunk(raw) is None


def _replies(reply: Reply) -> list[bytes]:
    if reply is None:
        return []
    return [reply] if isinstance(reply, bytes) else list(reply)


def _stream_replies(env: Env, chunks: list[pb.ProcessingRequest]) -> list[bytes]:
    request = headers()
    request.protocol_config.request_body_mode = FULL_DUPLEX
    request.protocol_config.response_body_mode = FULL_DUPLEX
    completion = {"model": "food-review", "prompt": "Write a review", "max_tokens": 10}
    content_type = "text/event-stream" if b"data:" in chunks[0].response_body.body else "application/json"
    response = headers({":status": "200", "content-type": content_type}, response=True)
    messages = [request, body(completion), response, *chunks]

    async def run() -> list[bytes]:
        stream = env.servicer().new_stream()
        out: list[bytes] = []
        try:
            for message in messages:
                reply, end = await stream.handle(message.SerializeToString())
                assert not end, reply
                out += _replies(reply)
        finally:
            stream.close()
        return out

    return asyncio.run(run())


SAMPLES = [
    "inference_model_input_tokens_sum",
    "inference_model_output_tokens_sum",
    "inference_model_response_sizes_sum",
    "inference_model_response_sizes_count",
    "inference_model_request_duration_seconds_count",
]


@pytest.mark.parametrize(
    "pieces",
    [
        pytest.param([(JSON, False), (b"", True)], id="json-then-empty-end-as-envoy-sends"),
        pytest.param([(JSON[:9], False), (JSON[9:], True)], id="json-split"),
        pytest.param([(SSE[:30], False), (SSE[30:70], False), (SSE[70:], False), (b"", True)], id="sse"),
        pytest.param([(b"{not json", True)], id="invalid-json"),
    ],
)
def test_a_stream_answers_and_counts_as_the_general_path_does(pieces: list[tuple[bytes, bool]]) -> None:
    def env() -> Env:
        return Env().pool().model("food-review").pod("pod-1", "10.0.0.1")

    # Envoy's wire form (the shortcut) against chunks whose attributes force the decoder.
    fast_env, general_env = env(), env()
    fast = _stream_replies(fast_env, [chunk_message(data, eos) for data, eos in pieces])
    general_chunks = [chunk_message(data, eos) for data, eos in pieces]
    for message in general_chunks:
        message.attributes["unrelated"].fields["k"].string_value = "v"
        assert plain_response_chunk(message.SerializeToString()) is None
    general = _stream_replies(general_env, general_chunks)
    assert fast == general
    echoed = [
        pb.ProcessingResponse.FromString(r).response_body.response.body_mutation for r in fast[-len(pieces) :]
    ]
    assert [(m.streamed_response.body, m.streamed_response.end_of_stream) for m in echoed] == pieces
    labels = {"model_name": "food-review", "target_model_name": "food-review"}
    counted = [fast_env.sample(name, labels) for name in SAMPLES]
    assert counted == [general_env.sample(name, labels) for name in SAMPLES]
    assert counted[3] == 1, "the response is counted once"
