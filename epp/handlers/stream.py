"""One ext_proc stream = one HTTP request: the per-stream state machine, free of gRPC.

`await ExtProcStream.handle(raw)` takes one serialised ProcessingRequest and returns the serialised
reply (or None) and whether the stream should end. The servicer only moves bytes, so this class is
where every protocol decision lives (DESIGN.md §2 Handlers and §6, epp-behaviour.md §6):

- request headers: remembered; a client-supplied destination hint is removed; a bodyless request
  (end_of_stream, e.g. GET) is routed at once to a random pod.
- FULL_DUPLEX_STREAMED (Envoy says so in `protocol_config`; what upstream's streaming server
  speaks): Envoy sends headers and body chunks without waiting for replies, so nothing is answered
  until the body is complete (end_of_stream, or the request trailers); then one reply per phase in
  order: the headers (destination, Content-Length of the body as forwarded, the client's hint
  removed, metadata), the body itself in `streamed_response` chunks of at most 64 KiB, and the
  trailers when the client sent some. One round trip per request instead of two.
- request body: chunks are accumulated until the body is complete: end_of_stream, the one BUFFERED
  message (Envoy says so in `protocol_config`), or as many bytes as the request's Content-Length.
  More than `max_body_bytes` is refused with 413 at once, however it arrives. Then: no pool → 503
  before anything else; the body is scanned (big ones in a child process, `epp.body`), the model
  resolved, a pod scheduled, and the reply carries the destination as a header and as dynamic
  metadata, with `model` spliced into the client's bytes and Content-Length set when the target
  differs. Each non-final chunk is answered by holding it back (clear_body), and the final reply
  carries the whole body, so a split body still reaches the model server exactly once.
- request trailers before the body is complete (BUFFERED/STREAMED): a trailers reply cannot carry
  the held-back body, so the request is refused with 400 and a message saying why, instead of
  waiting forever. In full duplex the trailers end the body instead (see above).
- response headers/body: only observed (status, SSE, size, token usage), never changed. With a
  FULL_DUPLEX_STREAMED response body (the v1 set-up of upstream's test envoy.yaml) Envoy forwards
  only what comes back, so each chunk is handed back at once, unchanged, in `streamed_response`;
  response trailers end the response when its last chunk did not.
- the v1 destination is a comma list: the scheduler's pick, then `fallbacks` more from the same
  ranking (`PodScheduler.rank`); only the pick counts as in flight. The proxy's subset hint
  (`epp.handlers.subset`, request metadata) limits the candidates of every routed request, bodyless
  ones too; none left is 503.
- any `EppError` becomes an ImmediateResponse and ends the stream; an unexpected exception on the
  request side becomes Internal (500) with its traceback logged; on the response side it is logged
  and the response continues untouched.

Metric labels: `model_name` is the requested model only once a rewrite rule names it exactly; any
other name (and a target the client chose) is counted under `UNKNOWN_MODEL`, so clients cannot
create series. Which model goes upstream and at what priority is `request.resolve`'s business.
"""

from __future__ import annotations

import functools
import logging
import random
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.message import DecodeError

from epp.api.types import InferencePool, Objective, RewriteMatch
from epp.body import BodyScanner, with_model
from epp.config import NO_CONFORMANCE_HOOKS, ConformanceHooks
from epp.datastore.types import PodMetrics
from epp.errors import BadRequest, EppError, Internal, NoEndpoints, PayloadTooLarge
from epp.handlers import responses
from epp.handlers.accounting import (
    NO_ACCOUNTING,
    Accounting,
    Dispatch,
    PrefixQuery,
    prompt_token_estimate,
)
from epp.handlers.conformance import ENDPOINT_SELECTION_HEADER, selected_endpoints, served_result_reply
from epp.handlers.request import resolve
from epp.handlers.served import served_endpoint
from epp.handlers.subset import SUBSET_KEY, SUBSET_NAMESPACE, Subset, parse_subset
from epp.handlers.usage import MAX_JSON_RESPONSE_BYTES, SseUsageScanner, Usage, usage_from_json
from epp.metrics import UNKNOWN_MODEL, RequestMetrics
from epp.scheduling import LLMRequest

log = logging.getLogger(__name__)

_BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
_NO_BODY = processing_mode_pb2.ProcessingMode.NONE

Reply = bytes | tuple[bytes, ...] | None
"""What one message gets back: nothing, one ProcessingResponse, or several in order (full duplex)."""
_SSE_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")
# Response statuses from which the request counts as a ModelServerError (once per stream).
_FIRST_ERROR_STATUS = 400

_REQUEST_SIDE = frozenset(("request_headers", "request_body", "request_trailers"))
_RESPONSE_SIDE = frozenset(("response_headers", "response_body", "response_trailers"))
_NO_POOL = "no InferencePool is known to the endpoint picker"

# What the response body is, for usage accounting.
_UNKNOWN, _JSON, _SSE, _IGNORED = range(4)


class ProtocolError(Exception):
    """Envoy sent something that is not an ext_proc message we handle: a gRPC error, not HTTP."""


class RoutingView(Protocol):
    """The datastore reads a request needs (the Datastore Protocol satisfies it)."""

    def pool_get(self) -> InferencePool | None: ...

    def rewrite_match(self, model: str) -> RewriteMatch | None: ...

    def objective_get(self, name: str) -> Objective | None: ...

    def pod_get_all(self) -> Sequence[PodMetrics]: ...


class PodScheduler(Protocol):
    def rank(self, request: LLMRequest, pods: list[PodMetrics], limit: int) -> Sequence[PodMetrics]:
        """The pick first, then up to `limit - 1` fallbacks from the same decision (epp.scheduling)."""
        ...


@dataclass(frozen=True, slots=True)
class StreamDeps:
    """Everything a stream shares with every other stream; built once per servicer."""

    datastore: RoutingView
    scheduler: PodScheduler
    metrics: RequestMetrics
    rng: random.Random
    clock: Callable[[], float]
    destination: responses.Destination
    replies: responses.ConstantReplies
    body_scanner: BodyScanner
    max_body_bytes: int
    accounting: Accounting = NO_ACCOUNTING
    # How many fallback endpoints follow the pick in the destination list (0: the pick alone).
    fallbacks: int = 0
    # Honour the proxy's subset hint (`--disable-endpoint-subset-filter` turns it off).
    subset_filter: bool = True
    # Upstream's test plugins, when a config names them (epp.handlers.conformance).
    conformance: ConformanceHooks = NO_CONFORMANCE_HOOKS


def destination_list(ranked: Sequence[PodMetrics]) -> str:
    """The destination value of the v1 protocol: `ip:port` comma list, the pick first, then fallbacks
    (each endpoint's own target port of the pool; IPv6 in brackets)."""
    return ",".join(pod.pod.endpoint for pod in ranked)


def _subset_of(metadata: Any) -> Subset | None:
    """The subset hint in a request's metadata_context, if it has one (`epp.handlers.subset`)."""
    namespace = metadata.filter_metadata.get(SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace.fields:
        return None
    value = namespace.fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return parse_subset(value.string_value)
    if kind == "list_value":
        return parse_subset(
            [
                item.string_value
                for item in value.list_value.values
                if item.WhichOneof("kind") == "string_value"
            ]
        )
    # Neither form of the protocol: ignored, as upstream does (its type check finds no list).
    log.debug("ignoring a subset hint of kind %s", kind)
    return None


# The one message of a full duplex response that comes often and needs no decoding: a body chunk.
# On the wire (Envoy 1.40) it is ProcessingRequest{response_body (5): HttpBody{body (1), end_of_stream
# (2)}} followed by an empty metadata_context (8); HttpBody and StreamedBodyResponse number those two
# fields alike, so the chunk's own bytes are the reply's innermost message.
_RESPONSE_BODY_TAG = 0x2A  # field 5, length-delimited
_BODY_TAG = 0x0A  # HttpBody.body, StreamedBodyResponse.body: field 1, length-delimited
_END_OF_STREAM = b"\x10\x01"  # HttpBody.end_of_stream, StreamedBodyResponse.end_of_stream: true
_METADATA_TAG = 0x42  # ProcessingRequest.metadata_context: field 8, length-delimited


def _varint(data: bytes, at: int, end: int) -> tuple[int, int]:
    """The base-128 varint at `at` (before `end`): (value, position after it), or (-1, at)."""
    value = shift = 0
    position = at
    while position < end and shift < 35:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    return -1, at


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited_length(size: int) -> int:
    """Bytes of a length-delimited field (1-byte tag) whose content is `size` bytes."""
    return 1 + len(_encode_varint(size)) + size


@functools.lru_cache(maxsize=4096)
def _streamed_response_prefix(size: int) -> bytes:
    """The bytes before a `size`-byte StreamedBodyResponse in a response_body ProcessingResponse:
    response_body (4) > response (1) > body_mutation (3) > streamed_response (3), as upb writes it."""
    mutation = _delimited_length(size)
    common = _delimited_length(mutation)
    body_response = _delimited_length(common)
    return b"".join(
        (
            b"\x22",
            _encode_varint(body_response),
            b"\x0a",
            _encode_varint(common),
            b"\x1a",
            _encode_varint(mutation),
            b"\x1a",
            _encode_varint(size),
        )
    )


def _only_metadata_follows(raw: bytes, at: int, end: int) -> bool:
    """Whether ``raw[at:end]`` is one metadata_context field and nothing else. Envoy adds one to every
    message (empty, or with the namespaces it forwards), and on a response chunk nothing in it matters
    to the EPP: the subset hint is read before routing, the served endpoint with the response headers."""
    if at >= end or raw[at] != _METADATA_TAG:
        return False
    length, first = _varint(raw, at + 1, end)
    return length >= 0 and first + length == end


def plain_response_chunk(raw: bytes) -> tuple[bytes, bool, bytes] | None:
    """A serialised ProcessingRequest that holds a response body chunk and nothing that needs a
    decoder: (chunk, end_of_stream, the reply handing it back in `streamed_response`), or None.

    None (decode it the general way) for anything else: other fields (observability_mode,
    protocol_config, attributes), other HttpBody fields, an empty `body` written out, a chunk
    over `STREAMED_CHUNK_BYTES` (its reply is cut in pieces), or bytes that do not parse.
    """
    end = len(raw)
    if not end or raw[0] != _RESPONSE_BODY_TAG:
        return None
    size, start = _varint(raw, 1, end)
    if size < 0:
        return None
    stop = start + size
    if stop != end and not _only_metadata_follows(raw, stop, end):
        return None
    chunk = b""
    position = start
    if position < stop and raw[position] == _BODY_TAG:
        length, first = _varint(raw, position + 1, stop)
        if length <= 0 or first + length > stop or length > responses.STREAMED_CHUNK_BYTES:
            return None
        position = first + length
        chunk = raw[first:position]
    end_of_stream = False
    if position < stop:
        if stop - position != 2 or raw[position:stop] != _END_OF_STREAM:
            return None
        end_of_stream = True
    return chunk, end_of_stream, _streamed_response_prefix(size) + raw[start:stop]


def _header_value(header: Any) -> str:
    # Envoy ≥ 1.31 fills raw_value (bytes) and leaves value empty; older ones use value.
    raw: bytes = header.raw_value
    if raw:
        return raw.decode("latin-1")
    value: str = header.value
    return value


class ExtProcStream:
    """Per-stream request context plus the handling of each message kind."""

    __slots__ = (
        "_body_chunks",
        "_body_size",
        "_buffered_mode",
        "_decided",
        "_declared_length",
        "_deps",
        "_duplex",
        "_error_counted",
        "_in_flight",
        "_json_body",
        "_prompt_tokens",
        "_received_at",
        "_response_body_sent",
        "_response_done",
        "_response_duplex",
        "_response_kind",
        "_response_size",
        "_routed",
        "_routing",
        "_sse",
        "_subset",
        "headers",
        "model",
        "response_status",
        "target",
        "usage",
    )

    def __init__(self, deps: StreamDeps) -> None:
        self._deps = deps
        self.headers: dict[str, str] = {}
        self.model = ""
        self.target = ""
        self.response_status = 0
        self.usage: Usage | None = None
        self._received_at = deps.clock()
        self._buffered_mode = False
        self._duplex = False  # FULL_DUPLEX_STREAMED: answer the request side once, when the body is complete
        # FULL_DUPLEX_STREAMED response body: every chunk goes back in its reply.
        self._response_duplex = False
        # Envoy's protocol_config says the response body will be sent here (its first chunk ends the
        # prompt's prefill in the accounting); unknown without one.
        self._response_body_sent = False
        self._subset: Subset | None = None  # the proxy's subset hint, when it sent one
        self._body_chunks: list[bytes] = []
        self._body_size = 0
        self._declared_length: int | None = None  # Content-Length of the request, when sent
        self._routed = False  # a body was routed: the running-requests gauge counts this stream
        self._decided = False  # a destination was sent (with or without a body): never a second one
        self._error_counted = False
        self._response_kind = _UNKNOWN
        self._sse = SseUsageScanner()
        self._json_body: list[bytes] = []
        self._response_size = 0
        self._response_done = False
        self._in_flight: Dispatch | None = None
        self._prompt_tokens = 0  # the routed prompt's estimated size
        # What the pick was made from (ranked pods, target model, prefix query): a fallback that
        # serves takes the in-flight count over (`epp.handlers.served`).
        self._routing: tuple[Sequence[PodMetrics], str, PrefixQuery] | None = None

    # --- entry points ----------------------------------------------------------------------------
    async def handle(self, raw: bytes) -> tuple[Reply, bool]:
        """Reply to one serialised ProcessingRequest: (reply bytes, several, or None; end the stream?)."""
        if self._response_duplex:
            # The v1 set-up's most frequent message, answered without a decode or an encode: the
            # reply is exactly what the general path below would build (tests/unit/handlers).
            plain = plain_response_chunk(raw)
            if plain is not None:
                chunk, end_of_stream, reply = plain
                self._observe("response_body", self._response_chunk, chunk, end_of_stream)
                return (reply,), False
        try:
            req = pb.ProcessingRequest.FromString(raw)
        except DecodeError as exc:
            raise ProtocolError(f"undecodable ProcessingRequest: {exc}") from exc
        if req.HasField("protocol_config"):
            config = req.protocol_config
            mode = config.request_body_mode
            self._buffered_mode = mode == _BUFFERED
            self._duplex = mode == _FULL_DUPLEX
            self._response_duplex = config.response_body_mode == _FULL_DUPLEX
            self._response_body_sent = config.response_body_mode != _NO_BODY
        # The hint limits the candidates of the one routing decision: after it, nothing reads it.
        if not self._decided and req.HasField("metadata_context") and self._deps.subset_filter:
            subset = _subset_of(req.metadata_context)
            if subset is not None:
                self._subset = subset
        if req.observability_mode:
            # Envoy expects no reply in observability mode; what it tells us is still recorded.
            return None, (await self._dispatch(req))[1]
        return await self._dispatch(req)

    async def _dispatch(self, req: pb.ProcessingRequest) -> tuple[Reply, bool]:
        kind = req.WhichOneof("request")
        if kind in _REQUEST_SIDE:
            try:
                if kind == "request_headers":
                    return self._request_headers(req.request_headers), False
                if kind == "request_body":
                    return await self._request_body(req.request_body), False
                return await self._request_trailers(), False
            except EppError as err:
                return self._fail(err), True
            except Exception as exc:
                # The traceback goes into the message as text: a record holding exc_info would keep
                # every frame up to the gRPC server alive for as long as the record lives.
                log.error("internal error handling %s:\n%s", kind, "".join(traceback.format_exception(exc)))
                return self._fail(Internal("internal error in the endpoint picker")), True
        if kind in _RESPONSE_SIDE:
            if kind == "response_headers":
                if self._routing is not None and req.HasField("metadata_context"):
                    self._observe(kind, self._served, req.metadata_context)
                self._observe(kind, self._response_headers, req.response_headers)
            elif kind == "response_body":
                msg = req.response_body
                self._observe(kind, self._response_chunk, msg.body, msg.end_of_stream)
            else:
                # Trailers end a response whose last body chunk did not (full duplex sends them).
                self._observe(kind, self._response_complete)
            replies = self._deps.replies
            if kind == "response_headers":
                if self._deps.conformance.served_endpoint_header:
                    metadata = req.metadata_context if req.HasField("metadata_context") else None
                    return served_result_reply(metadata), False
                return replies.response_headers, False
            if kind == "response_trailers":
                return replies.response_trailers, False
            if self._response_duplex:
                # Full duplex: Envoy forwards only what comes back, so each chunk is handed back
                # unchanged at once (an SSE stream keeps its pace), end_of_stream as it came.
                msg = req.response_body
                return responses.streamed_body(msg.body, msg.end_of_stream, phase="response_body"), False
            return replies.response_body, False
        raise ProtocolError(f"unsupported ProcessingRequest: {kind or 'no message set'}")

    def _observe(self, kind: str, observer: Callable[..., None], *args: Any) -> None:
        """Run a response-side observer; usage accounting is best effort, so a failure is logged and
        the client's response never suffers from it."""
        try:
            observer(*args)
        except Exception as exc:
            log.error(
                "error observing %s; response passed through:\n%s",
                kind,
                "".join(traceback.format_exception(exc)),
            )

    def close(self) -> None:
        """The stream ended (EOF, cancel or error): release what `request_routed` took."""
        if self._in_flight is not None:
            dispatch, self._in_flight = self._in_flight, None
            self._deps.accounting.finished(dispatch)
        if self._routed:
            self._routed = False
            self._deps.metrics.request_finished(self.model)

    # --- request side ----------------------------------------------------------------------------
    def _request_headers(self, msg: pb.HttpHeaders) -> bytes | None:
        key = self._deps.destination.header_key
        client_hint = False
        headers = self.headers
        for header in msg.headers.headers:
            name = header.key.lower()
            value = headers[name] = _header_value(header)
            if name == key:
                client_hint = True
            elif name == "content-length":
                self._declared_length = int(value) if value.isdigit() else None
        if msg.end_of_stream and not self._decided:
            return self._route_bodyless()
        if self._duplex:
            return None  # answered with the routing decision, once the body is complete
        replies = self._deps.replies
        return replies.request_headers_strip if client_hint else replies.request_headers

    def _route_bodyless(self) -> bytes:
        """No body, no model: a uniform draw (as upstream), then as many other pods at random."""
        pods = self._candidates(self._deps.datastore.pool_get())
        rng = self._deps.rng
        first = rng.choice(pods)
        others = [p for p in pods if p is not first]
        ranked = [first, *rng.sample(others, min(self._deps.fallbacks, len(others)))]
        self._decided = True
        return responses.route(self._deps.destination, destination_list(ranked), phase="request_headers")

    async def _request_body(self, msg: pb.HttpBody) -> Reply:
        if self._decided:
            # Already decided (a trailing chunk after a BUFFERED body, a body after end_of_stream on
            # the headers): let it through unchanged. One stream, one destination. In full duplex the
            # whole body went back with the decision (under its Content-Length): nothing more is.
            return None if self._duplex else self._deps.replies.request_body
        self._body_size += len(msg.body)
        limit = self._deps.max_body_bytes
        if self._body_size > limit:
            self._body_chunks = []
            raise PayloadTooLarge(f"request body larger than the endpoint picker's limit of {limit} bytes")
        if self._duplex:
            # Envoy streams and the body comes back in the reply: only its end completes it.
            complete = msg.end_of_stream
        else:
            complete = (
                msg.end_of_stream
                or self._buffered_mode
                or (self._declared_length is not None and self._body_size >= self._declared_length)
            )
        if not complete:
            self._body_chunks.append(msg.body)
            return None if self._duplex else self._deps.replies.request_body_held
        split = bool(self._body_chunks)
        if split:
            self._body_chunks.append(msg.body)
            raw = b"".join(self._body_chunks)
            self._body_chunks = []
        else:
            raw = msg.body
        return await self._route(raw, split)

    async def _request_trailers(self) -> Reply:
        trailers = self._deps.replies.request_trailers
        if self._decided:
            return trailers
        if self._duplex:
            # The trailers end the body: route on what came, send it back, then the trailers.
            raw, self._body_chunks = b"".join(self._body_chunks), []
            return await self._route(raw, True, then=(trailers,))
        # A TrailersResponse cannot carry the body held back so far: refuse rather than hang.
        raise BadRequest(
            "request trailers arrived before the request body ended; the endpoint picker routes on "
            "the whole body (send a Content-Length, or configure Envoy's request_body_mode BUFFERED)"
        )

    async def _route(self, raw: bytes, split: bool, *, then: tuple[bytes, ...] = ()) -> Reply:
        deps = self._deps
        pool = deps.datastore.pool_get()
        if pool is None:
            # Nothing is routable without a pool: 503 (retry later) before any model lookup, so a
            # model that exists is never reported missing while the EPP is starting.
            raise NoEndpoints(_NO_POOL)
        scanned = await deps.body_scanner.scan(raw)
        self.model = UNKNOWN_MODEL
        resolved = resolve(pool, deps.datastore, scanned.model, self.headers, deps.rng)
        self.model = scanned.model if resolved.model_declared else UNKNOWN_MODEL
        target = resolved.target
        self.target = target if resolved.target_declared else UNKNOWN_MODEL
        pods = self._candidates(pool)
        accounting = deps.accounting
        prefix = accounting.prefix_query(scanned.prompt_head, target)
        self._prompt_tokens = prompt_token_estimate(len(raw))
        request = LLMRequest(
            scanned.model,
            target,
            not resolved.sheddable,
            len(prefix.hashes),
            prefix.matches,
            self._prompt_tokens,
            accounting.clock(),
            self._response_body_sent,
        )
        ranked = deps.scheduler.rank(request, pods, 1 + deps.fallbacks)
        # Only the pick counts as in flight: a fallback serves the request only if the pick cannot.
        self._in_flight = accounting.routed(
            ranked[0], target, prefix, self._prompt_tokens, self._response_body_sent
        )
        if len(ranked) > 1:
            self._routing = (ranked, target, prefix)
        endpoint = destination_list(ranked)
        rewritten = target != scanned.model
        body = with_model(raw, scanned, target) if rewritten else raw
        if len(body) > deps.max_body_bytes:
            # Only a rewrite can grow the body past the limit it arrived under. Envoy's buffer has
            # the same limit and would refuse the longer body anyway.
            raise PayloadTooLarge(
                f"request body larger than the endpoint picker's limit of {deps.max_body_bytes} bytes "
                f"once its model is rewritten to {target}"
            )
        if self._duplex:
            headers = responses.route(
                deps.destination, endpoint, phase="request_headers", content_length=len(body)
            )
            # `then` follows the body (the trailers' reply): the body does not end the stream then.
            reply: Reply = (headers, *responses.streamed_body(body, not then), *then)
        elif rewritten:
            reply = responses.route(
                deps.destination, endpoint, phase="request_body", body=body, content_length=len(body)
            )
        else:
            # Unchanged bytes: no Content-Length to fix. Held chunks must come back in one piece.
            reply = responses.route(
                deps.destination, endpoint, phase="request_body", body=raw if split else None
            )
        deps.metrics.request_routed(self.model, self.target, len(raw))
        self._routed = self._decided = True
        if log.isEnabledFor(logging.DEBUG):
            log.debug("routed model=%s target=%s to %s", scanned.model, target, endpoint)
        return reply

    def _candidates(self, pool: InferencePool | None) -> list[PodMetrics]:
        """The pods a request to `pool` may go to: every ready pod, within the proxy's subset."""
        if pool is None:
            raise NoEndpoints(_NO_POOL)
        pods = list(self._deps.datastore.pod_get_all())
        if not pods:
            raise NoEndpoints(f"no ready endpoints in InferencePool {pool.key.name}")
        subset = self._subset
        if subset is not None:
            pods = [p for p in pods if subset.allows(p.pod.address, p.pod.port)]
            if not pods:
                raise NoEndpoints(
                    f"no ready endpoint of InferencePool {pool.key.name} is in the subset the proxy "
                    f"allowed ({subset.describe()})"
                )
        if self._deps.conformance.endpoint_selection_header:
            selection = selected_endpoints(self.headers)
            pods = [p for p in pods if selection.allows(p.pod.address, p.pod.port)]
            if not pods:
                raise NoEndpoints(
                    f"no ready endpoint of InferencePool {pool.key.name} is named in the request's "
                    f"{ENDPOINT_SELECTION_HEADER} header ({selection.describe()})"
                )
        return pods

    def _fail(self, err: EppError) -> bytes:
        self._count_error(err.metric_code)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request rejected with %d: %s", err.http_status, err.message)
        return responses.immediate(err)

    def _count_error(self, code: str) -> None:
        if not self._error_counted:
            self._error_counted = True
            self._deps.metrics.request_failed(self.model, self.target, code)

    # --- response side ---------------------------------------------------------------------------
    def _served(self, metadata: Any) -> None:
        """The proxy says which endpoint served: a fallback takes the request over from the pick."""
        if self._routing is None:
            return
        endpoint = served_endpoint(metadata)
        ranked, target, prefix = self._routing
        if endpoint is None or endpoint == ranked[0].pod.endpoint:
            return
        served = next((pod for pod in ranked[1:] if pod.pod.endpoint == endpoint), None)
        if served is None:
            log.debug("served by %s, which is not among the endpoints sent: ignored", endpoint)
            return
        self._in_flight = self._deps.accounting.served_by(
            self._in_flight, served, target, prefix, self._prompt_tokens, self._response_body_sent
        )

    def _response_headers(self, msg: pb.HttpHeaders) -> None:
        for header in msg.headers.headers:
            name = header.key.lower()
            if name == ":status":
                value = _header_value(header)
                self.response_status = int(value) if value.isdigit() else 0
            elif name == "content-type":
                sse = "text/event-stream" in _header_value(header).lower()
                self._response_kind = _SSE if sse else _JSON
        if self._routed and self.response_status >= _FIRST_ERROR_STATUS:
            self._count_error("ModelServerError")
        if msg.end_of_stream:
            self._response_complete()

    def _response_chunk(self, chunk: bytes, end_of_stream: bool) -> None:
        dispatch = self._in_flight
        if chunk and dispatch is not None and not dispatch.prefilled:
            self._in_flight = self._deps.accounting.first_byte(dispatch)  # the prompt is prefilled
        self._response_size += len(chunk)
        kind = self._response_kind
        if kind == _UNKNOWN:
            # No content-type seen (response headers SKIPped): tell SSE from JSON by the first bytes.
            kind = self._response_kind = _SSE if chunk.lstrip().startswith(_SSE_STARTS) else _JSON
        if kind == _SSE:
            self._sse.feed(chunk)
        elif kind == _JSON:
            if self._response_size <= MAX_JSON_RESPONSE_BYTES:
                self._json_body.append(chunk)
            else:
                # Too big to hold: pass it on without usage accounting.
                self._response_kind = _IGNORED
                self._json_body = []
        if end_of_stream:
            self._response_complete()

    def _response_complete(self) -> None:
        if self._response_done:
            return
        self._response_done = True
        if self._response_kind == _SSE:
            self._sse.finish()
            self.usage = self._sse.usage
        elif self._response_kind == _JSON and self._json_body:
            self.usage = usage_from_json(b"".join(self._json_body))
        if not self._routed:
            return
        usage = self.usage or Usage()
        self._deps.metrics.response_complete(
            self.model,
            self.target,
            duration=self._deps.clock() - self._received_at,
            response_size=self._response_size,
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
        )
