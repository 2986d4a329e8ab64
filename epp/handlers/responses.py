"""The ProcessingResponse messages the EPP sends Envoy, built with `xds-protos` (upb).

Replies that never vary (CONTINUE for each phase) are serialised once per servicer and sent as bytes:
the servicer is registered without a response serializer, so the hot path never rebuilds them.
The per-request ones (the routing decision, an ImmediateResponse) are built here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.errors import EppError

# An ImmediateResponse body is one readable line; a pathological message is cut here.
MAX_MESSAGE_CHARS = 1024
_JSON = b"application/json"


def _continue(phase: str, remove: str | None = None) -> bytes:
    resp = pb.ProcessingResponse()
    common = getattr(resp, phase).response
    if remove is None:
        common.SetInParent()
    else:
        common.header_mutation.remove_headers.append(remove)
    return bytes(resp.SerializeToString())


def _trailers(phase: str) -> bytes:
    resp = pb.ProcessingResponse()
    getattr(resp, phase).SetInParent()
    return bytes(resp.SerializeToString())


@dataclass(frozen=True, slots=True)
class ConstantReplies:
    """Pre-serialised CONTINUE replies; `request_headers_strip` also removes the client's hint."""

    request_headers: bytes
    request_headers_strip: bytes
    request_body: bytes
    request_body_held: bytes
    response_headers: bytes
    response_body: bytes
    request_trailers: bytes
    response_trailers: bytes

    @classmethod
    def build(cls, destination_key: str) -> ConstantReplies:
        held = pb.ProcessingResponse()
        # A non-final body chunk is held back (its bytes come out again in the final reply's body
        # mutation), so a body Envoy sends in several messages is still forwarded exactly once.
        held.request_body.response.body_mutation.clear_body = True
        return cls(
            request_headers=_continue("request_headers"),
            request_headers_strip=_continue("request_headers", remove=destination_key),
            request_body=_continue("request_body"),
            request_body_held=bytes(held.SerializeToString()),
            response_headers=_continue("response_headers"),
            response_body=_continue("response_body"),
            request_trailers=_trailers("request_trailers"),
            response_trailers=_trailers("response_trailers"),
        )


@dataclass(frozen=True, slots=True)
class Destination:
    """Where the routing decision is written: header key and dynamic-metadata namespace/key."""

    header_key: str
    metadata_namespace: str  # "" → the flat, pre-v0.2.0 form {key: endpoint}


def route(
    destination: Destination,
    endpoint: str,
    *,
    phase: str,
    body: bytes | None = None,
    content_length: int | None = None,
) -> bytes:
    """The reply that routes a request: destination header + metadata, optional body mutation.

    `phase` is "request_body" normally, "request_headers" for a bodyless request. The client's own
    hint header is removed too; Envoy applies removals before sets, so ours is the one that stays.
    """
    resp = pb.ProcessingResponse()
    common = getattr(resp, phase).response
    mutation = common.header_mutation
    hint = mutation.set_headers.add().header
    hint.key = destination.header_key
    hint.raw_value = endpoint.encode()
    if content_length is not None:
        length = mutation.set_headers.add().header
        length.key = "content-length"
        length.raw_value = str(content_length).encode()
    mutation.remove_headers.append(destination.header_key)
    if body is not None:
        common.body_mutation.body = body
    common.clear_route_cache = True
    fields = resp.dynamic_metadata.fields
    if destination.metadata_namespace:
        fields = fields[destination.metadata_namespace].struct_value.fields
    fields[destination.header_key].string_value = endpoint
    return bytes(resp.SerializeToString())


# Envoy's recommended ceiling for one streamed body chunk in FULL_DUPLEX_STREAMED mode.
STREAMED_CHUNK_BYTES = 64 * 1024


def streamed_body(body: bytes, end_of_stream: bool, *, phase: str = "request_body") -> tuple[bytes, ...]:
    """A body handed back to Envoy in full duplex mode (`phase` "request_body" or "response_body"):
    `streamed_response` chunks of at most `STREAMED_CHUNK_BYTES`, `end_of_stream` on the last one
    when asked (not when trailers follow)."""
    if len(body) <= STREAMED_CHUNK_BYTES:
        pieces = [body]
    else:
        pieces = [body[i : i + STREAMED_CHUNK_BYTES] for i in range(0, len(body), STREAMED_CHUNK_BYTES)]
    out = []
    for index, piece in enumerate(pieces):
        resp = pb.ProcessingResponse()
        streamed = getattr(resp, phase).response.body_mutation.streamed_response
        streamed.body = piece
        streamed.end_of_stream = end_of_stream and index == len(pieces) - 1
        out.append(bytes(resp.SerializeToString()))
    return tuple(out)


def one_line(text: str) -> str:
    """Collapse whitespace (a client-chosen model name may contain newlines) and cap the length."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_MESSAGE_CHARS else flat[: MAX_MESSAGE_CHARS - 3] + "..."


def error_body(error: EppError) -> bytes:
    """One line of JSON in the OpenAI/vLLM error shape, so OpenAI SDKs surface the message.

    `type` is the same code as the `error_code` label of inference_model_request_error_total, so a
    client report and the EPP's metrics name the failure alike.
    """
    payload = {
        "error": {"message": one_line(error.message), "type": error.metric_code, "code": error.http_status}
    }
    # ASCII escapes: the message may quote a client's model name, which may hold a lone surrogate
    # that no UTF-8 encoder accepts. JSON readers (every SDK) turn the escapes back into text.
    return json.dumps(payload).encode()


def immediate(error: EppError) -> bytes:
    """An ImmediateResponse: the error's HTTP status and a one-line JSON error body."""
    resp = pb.ProcessingResponse()
    imm = resp.immediate_response
    imm.status.code = error.http_status
    imm.body = error_body(error)
    content_type = imm.headers.set_headers.add().header
    content_type.key = "content-type"
    content_type.raw_value = _JSON
    imm.details = f"epp_{error.metric_code}"
    return bytes(resp.SerializeToString())
