"""Fuzzing the EPP's ext_proc server: what any client or Envoy can send, and what must never follow.

Hypothesis strategies build whole ext_proc streams: request headers (with a client's own destination
header, Content-Length right or wrong, x-envoy-* headers), request bodies split anywhere, trailers,
response messages, end_of_stream anywhere, observability mode, `protocol_config`, messages in any
order, and messages no ProcessingRequest decodes from. Bodies are JSON and not: valid requests for
known and unknown models, duplicate or non-string `model`, deep nesting, huge strings, out-of-range
and non-finite numbers, UTF-16/32, BOMs, lone surrogates, invalid UTF-8, random bytes.

`run_case` plays one stream against a live server over gRPC, as Envoy does (one message, then its
reply; or, when a message says FULL_DUPLEX_STREAMED, every message at once, then every reply), and
`violations` lists what broke. The properties (issue 12, Deliver 4):
- the stream ends OK, or INVALID_ARGUMENT only for a message that is not a ProcessingRequest we
  handle; it never hangs (every expected reply arrives) and never answers more than it was asked
  (in full duplex: the stream ends once Envoy has nothing more to send);
- client input never gets 500: every ImmediateResponse is 400, 404, 413, 429 or 503 with one line
  of OpenAI-style JSON;
- a destination is only ever a ready pod of the pool, at most one destination header per reply,
  header and metadata agree, and at most one routing decision per stream;
- a rewritten body is strict JSON (no NaN/Infinity) naming a target of the requested model, with a
  matching Content-Length (in full duplex: the body handed back in `streamed_response` chunks, put
  together, matches the Content-Length of the headers reply, and only its last chunk ends it).
The pytest CI profile (tests/unit/handlers/test_fuzz.py) drives the servicer in process; the long
profile (benchmarks/fuzz_ext_proc.py) drives a real EPP process and reports its memory.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import json_format
from hypothesis import strategies as st

PROCESS_METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
METADATA_NAMESPACE = "envoy.lb"
CLIENT_ERROR_STATUSES = frozenset({400, 404, 413, 429, 503})
CLIENT_CORE_RACE = "Internal error from Core"
# A body at least this big goes to the EPP's body-scanning child process (epp.body).
BIG_BODY = 300 * 1024
_BUFFERED, _STREAMED, _FULL_DUPLEX = 2, 1, 4  # ProcessingMode.BodySendMode


@dataclass(frozen=True)
class FuzzWorld:
    """What the EPP under test serves: modelName → the model names it may be rewritten to, and
    the `ip:port` of every ready pod of the pool."""

    models: Mapping[str, frozenset[str]]
    endpoints: frozenset[str]
    destination_header: str = DESTINATION_HEADER


@dataclass(frozen=True)
class Message:
    raw: bytes
    kind: str  # the ProcessingRequest field set, or "garbage" for bytes that are none
    expects_reply: bool = True

    @property
    def request_side(self) -> bool:
        return self.kind in ("request_headers", "request_body", "request_trailers")


@dataclass(frozen=True)
class FuzzCase:
    messages: tuple[Message, ...]
    body: bytes  # the request body the chunks were cut from

    @property
    def duplex(self) -> bool:
        """A message says FULL_DUPLEX_STREAMED: replies come when the EPP decides, not one per message."""
        for message in self.messages:
            if message.kind != "garbage":
                request = pb.ProcessingRequest.FromString(message.raw)
                if request.protocol_config.request_body_mode == _FULL_DUPLEX:
                    return True
        return False

    def __repr__(self) -> str:
        kinds = [m.kind + ("" if m.expects_reply else "(obs)") for m in self.messages]
        return f"FuzzCase({kinds}, body={self.body[:160]!r}{'...' if len(self.body) > 160 else ''})"


@dataclass
class Outcome:
    replies: list[pb.ProcessingResponse] = field(default_factory=list)
    code: grpc.StatusCode | None = None
    details: str = ""
    hung: bool = False
    extra_replies: int = 0
    # A write failed: the server had ended the stream while messages were still being sent (only
    # possible in observability mode, where nothing waits for replies). gRPC's client core may then
    # report INTERNAL "Internal error from Core" for a stream the server closed with OK.
    cut_short: bool = False


# --- request bodies ------------------------------------------------------------------------------
_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**20, max_value=10**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=15,
)
# Spellings a client may put where a number goes: out of range, negative zero, and non-JSON constants.
_number_tokens = st.sampled_from(
    ["1e999", "-1e999", "1E400", "-0", "0.0e-999", "NaN", "Infinity", "-Infinity"]
)
_encodings = st.sampled_from(
    ["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32-be", "latin-1"]
)


def _one_in(draw: st.DrawFn, n: int) -> bool:
    """True about once in `n` draws. Hypothesis favours the ends of a range, so compare with the middle."""
    return bool(draw(st.integers(0, n - 1)) == n // 2)


def _encode(text: str, encoding: str) -> bytes:
    return text.encode(encoding, "surrogatepass" if encoding.startswith("utf") else "replace")


@st.composite
def json_requests(draw: st.DrawFn, world: FuzzWorld) -> bytes:
    """A request object: a known or made-up model, odd values, any formatting and encoding."""
    model: Any = draw(
        st.sampled_from(sorted(world.models))
        | st.text(max_size=40)
        | st.sampled_from(["x\ud800y", "", " chat", "chat\n"])
        | json_values
    )
    fields: dict[str, Any] = draw(st.dictionaries(st.text(max_size=10), json_values, max_size=5))
    fields.pop("model", None)
    items = list(fields.items())
    items.insert(draw(st.integers(0, len(items))), ("model", model))
    if draw(st.booleans()):
        items.append(("prompt", "p" * draw(st.sampled_from([0, 10, 70_000, BIG_BODY]))))
    text = json.dumps(
        dict(items), ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 0, 2]))
    )
    if _one_in(draw, 5):  # an odd number token before the model
        text = text.replace('"model"', f'"n": {draw(_number_tokens)}, "model"', 1)
    if _one_in(draw, 9):  # a second "model" member
        text = text.replace("{", '{"model": "chat", ', 1)
    return _encode(text, draw(_encodings))


@st.composite
def deep_nesting(draw: st.DrawFn) -> bytes:
    depth = draw(st.sampled_from([50, 1000, 5000, 100_000]))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    inner = opener * depth + "1" + closer * depth * draw(st.sampled_from([0, 1]))
    return f'{{"model": "chat", "x": {inner}}}'.encode() if draw(st.booleans()) else inner.encode()


def request_bodies(world: FuzzWorld) -> st.SearchStrategy[bytes]:
    return st.one_of(
        json_requests(world),
        json_requests(world),
        deep_nesting(),
        st.binary(max_size=200),
        st.sampled_from(
            [b"", b"{", b"null", b"[]", b'"model"', b'{"model": NaN}', b"\xef\xbb\xbf", b"\xff\xfe"]
        ),
        json_requests(world).map(lambda raw: raw[: len(raw) // 2]),  # truncated
    )


# --- messages -------------------------------------------------------------------------------------
def _headers_map(headers: Sequence[tuple[str, str]]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers])


@st.composite
def _request_headers(draw: st.DrawFn, world: FuzzWorld, body_length: int) -> pb.ProcessingRequest:
    headers = [(":method", draw(st.sampled_from(["POST", "GET", "PUT"]))), (":path", "/v1/completions")]
    if draw(st.booleans()):
        declared = draw(
            st.sampled_from([body_length, body_length, 0, body_length + 7, max(0, body_length - 3)])
        )
        headers.append(("content-length", "-1" if _one_in(draw, 10) else str(declared)))
    if draw(st.booleans()):
        headers.append((world.destination_header, draw(st.sampled_from(["192.0.2.1:8000", "", "x"]))))
    headers += draw(
        st.lists(
            st.tuples(st.sampled_from(["x-envoy-original-dst-host", "x-custom"]), st.text(max_size=8)),
            max_size=2,
        )
    )
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=_headers_map(headers), end_of_stream=_one_in(draw, 6))
    )
    mode = draw(st.sampled_from([None, None, _BUFFERED, _STREAMED, _FULL_DUPLEX, 0]))
    if mode is not None:
        msg.protocol_config.request_body_mode = mode
    return msg


def _body(chunk: bytes, eos: bool, *, response: bool = False) -> pb.ProcessingRequest:
    msg = pb.HttpBody(body=chunk, end_of_stream=eos)
    return pb.ProcessingRequest(response_body=msg) if response else pb.ProcessingRequest(request_body=msg)


@st.composite
def _response_message(draw: st.DrawFn) -> pb.ProcessingRequest:
    which = draw(st.sampled_from(["headers", "body", "trailers"]))
    if which == "headers":
        headers = [(":status", draw(st.sampled_from(["200", "500", "abc"])))]
        headers.append(("content-type", draw(st.sampled_from(["application/json", "text/event-stream"]))))
        return pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(headers=_headers_map(headers), end_of_stream=draw(st.booleans()))
        )
    if which == "body":
        chunk = draw(
            st.sampled_from(
                [b'{"usage": {"prompt_tokens": 3, "completion_tokens": 2}}', b"data: [DONE]\n", b"\xff"]
            )
            | st.binary(max_size=64)
        )
        return _body(chunk, draw(st.booleans()), response=True)
    return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())


_garbage = st.one_of(
    st.binary(min_size=1, max_size=40),
    st.just(pb.ProcessingRequest().SerializeToString()),
    st.just(b"\x08\x01"),  # an unknown field only
)


def _message(request: pb.ProcessingRequest, observability: bool = False) -> Message:
    if observability:
        request.observability_mode = True
    return Message(request.SerializeToString(), str(request.WhichOneof("request")), not observability)


@st.composite
def ext_proc_cases(draw: st.DrawFn, world: FuzzWorld) -> FuzzCase:
    """One ext_proc stream: usually Envoy-shaped, often perturbed, sometimes nonsense."""
    body = draw(request_bodies(world))
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=3)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    eos_on_last = not _one_in(draw, 5)
    messages = [_message(draw(_request_headers(world, len(body))))]
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        messages.append(_message(_body(chunk, eos_on_last if last else _one_in(draw, 10))))
    if _one_in(draw, 4):
        messages.append(_message(pb.ProcessingRequest(request_trailers=pb.HttpTrailers())))
    for extra in draw(st.lists(_response_message(), max_size=3)):
        messages.append(_message(extra))
    if _one_in(draw, 10):
        messages.insert(draw(st.integers(0, len(messages))), Message(draw(_garbage), "garbage"))
    if _one_in(draw, 6):  # any order at all
        messages = list(draw(st.permutations(messages)))
    if _one_in(draw, 10):  # observability mode: Envoy expects no replies
        messages = [
            _message(pb.ProcessingRequest.FromString(m.raw), observability=True) if m.kind != "garbage" else m
            for m in messages
        ]
    return FuzzCase(tuple(messages), body)


# --- driving one stream ---------------------------------------------------------------------------
async def run_case(channel: grpc.aio.Channel, case: FuzzCase, reply_timeout: float = 20.0) -> Outcome:
    """Play the case as Envoy does: each message, then its reply (none in observability mode).

    A reply that takes longer than `reply_timeout` counts as a hang (Envoy's message timeout).
    """
    if case.duplex:
        return await _run_duplex(channel, case, reply_timeout)
    outcome = Outcome()
    call = channel.stream_stream(PROCESS_METHOD)()
    try:
        for message in case.messages:
            try:
                await call.write(message.raw)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                outcome.cut_short = True  # the server already ended the stream
                break
            if not message.expects_reply:
                continue
            try:
                reply = await asyncio.wait_for(call.read(), reply_timeout)
            except TimeoutError:
                outcome.hung = True
                return outcome
            except grpc.aio.AioRpcError:
                break
            if reply is grpc.aio.EOF:
                break
            parsed = pb.ProcessingResponse.FromString(reply)
            outcome.replies.append(parsed)
            if parsed.HasField("immediate_response"):
                break
        try:
            await call.done_writing()
            while (extra := await asyncio.wait_for(call.read(), reply_timeout)) is not grpc.aio.EOF:
                outcome.extra_replies += 1
                outcome.replies.append(pb.ProcessingResponse.FromString(extra))
        except TimeoutError:
            outcome.hung = True
            return outcome
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass
        outcome.code = await call.code()
        outcome.details = await call.details() or ""
        return outcome
    finally:
        if outcome.hung:
            call.cancel()


async def _run_duplex(channel: grpc.aio.Channel, case: FuzzCase, reply_timeout: float) -> Outcome:
    """Full duplex: every message without waiting (as Envoy streams), then every reply until the end.

    The messages go in as a request iterator, so grpc.aio stops sending by itself when the server has
    ended the stream (an ImmediateResponse) instead of failing a write.
    """
    outcome = Outcome()

    async def messages() -> AsyncIterator[bytes]:
        for message in case.messages:
            yield message.raw

    call = channel.stream_stream(PROCESS_METHOD)(messages())
    try:
        while (reply := await asyncio.wait_for(call.read(), reply_timeout)) is not grpc.aio.EOF:
            outcome.replies.append(pb.ProcessingResponse.FromString(reply))
    except TimeoutError:
        outcome.hung = True
        call.cancel()
        return outcome
    except grpc.aio.AioRpcError:
        pass
    outcome.code = await call.code()
    outcome.details = await call.details() or ""
    # The client core's own error for messages it still had to send after the server ended the stream.
    outcome.cut_short = outcome.code == grpc.StatusCode.INTERNAL and outcome.details == CLIENT_CORE_RACE
    return outcome


# --- what must never happen -----------------------------------------------------------------------
def _strict_json(raw: bytes) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def _requested_model(body: bytes) -> Any:
    try:
        return json.loads(body).get("model")
    except (ValueError, AttributeError, RecursionError):
        return None


def violations(world: FuzzWorld, case: FuzzCase, outcome: Outcome) -> list[str]:
    """Every property this outcome breaks (empty: all held)."""
    problems: list[str] = []
    if outcome.hung:
        return ["the stream hung: an expected reply never came"]
    if outcome.extra_replies:
        problems.append(f"{outcome.extra_replies} replies nobody asked for")
    if outcome.code == grpc.StatusCode.INVALID_ARGUMENT:
        if not any(
            m.kind == "garbage" or not m.kind.startswith(("request", "response")) for m in case.messages
        ):
            problems.append(f"INVALID_ARGUMENT without an invalid message: {outcome.details}")
    elif outcome.code != grpc.StatusCode.OK and not (
        outcome.cut_short and outcome.code == grpc.StatusCode.INTERNAL and outcome.details == CLIENT_CORE_RACE
    ):
        problems.append(f"stream ended with {outcome.code}: {outcome.details}")
    routing_replies = 0
    bodies = _bodies_so_far(case)
    for reply in outcome.replies:
        if reply.HasField("immediate_response"):
            problems += _immediate_problems(reply.immediate_response)
            continue
        routed, found = _destination_problems(world, reply)
        problems += found
        routing_replies += routed
        if not case.duplex:
            problems += _body_problems(world, bodies, reply)
    if case.duplex:
        problems += _streamed_problems(world, bodies, outcome.replies, outcome.code == grpc.StatusCode.OK)
    if routing_replies > 1:
        problems.append(f"{routing_replies} routing decisions in one stream")
    return problems


def _immediate_problems(imm: pb.ImmediateResponse) -> list[str]:
    status = int(imm.status.code)
    if status not in CLIENT_ERROR_STATUSES:
        return [f"ImmediateResponse {status} for client input: {imm.body[:200]!r}"]
    try:
        error = json.loads(imm.body)["error"]
    except (ValueError, KeyError, TypeError):
        return [f"ImmediateResponse body is not OpenAI-style JSON: {imm.body[:200]!r}"]
    problems = []
    if b"\n" in imm.body:
        problems.append("ImmediateResponse body spans several lines")
    if error.get("code") != status or not error.get("message"):
        problems.append(f"ImmediateResponse error does not match its status {status}: {error}")
    return problems


def _destination_problems(world: FuzzWorld, reply: pb.ProcessingResponse) -> tuple[int, list[str]]:
    problems = []
    which = reply.WhichOneof("response")
    common = getattr(reply, which).response if which in ("request_headers", "request_body") else None
    header_values = _set_header(common, world.destination_header) if common is not None else []
    metadata = json_format.MessageToDict(reply.dynamic_metadata) if reply.HasField("dynamic_metadata") else {}
    meta_value = (metadata.get(METADATA_NAMESPACE) or {}).get(world.destination_header)
    if len(header_values) > 1:
        problems.append(f"{len(header_values)} destination headers in one reply: {header_values}")
    for value in [*header_values, *([meta_value] if meta_value is not None else [])]:
        if value not in world.endpoints:
            problems.append(f"destination {value!r} is not a ready pod of the pool")
    if header_values and meta_value is not None and header_values[0] != meta_value:
        problems.append(f"header {header_values[0]!r} and metadata {meta_value!r} disagree")
    if reply.HasField("dynamic_metadata") and meta_value is None:
        problems.append(f"dynamic metadata without a destination: {metadata}")
    return (1 if (header_values or meta_value is not None) else 0), problems


def _bodies_so_far(case: FuzzCase) -> list[bytes]:
    """The request body as the EPP may have seen it when it decided: the first k chunks, in arrival order."""
    chunks = [
        pb.ProcessingRequest.FromString(m.raw).request_body.body
        for m in case.messages
        if m.kind == "request_body"
    ]
    return [b"".join(chunks[:k]) for k in range(1, len(chunks) + 1)]


def _body_problems(world: FuzzWorld, bodies: list[bytes], reply: pb.ProcessingResponse) -> list[str]:
    which = reply.WhichOneof("response")
    if which not in ("request_headers", "request_body"):
        return []
    common = getattr(reply, which).response
    lengths = _set_header(common, "content-length")
    has_body = common.body_mutation.HasField("body")
    if not lengths:
        if has_body and common.body_mutation.body not in bodies:
            # Forwarded unchanged (held chunks put back together): must be exactly what was sent.
            return [
                f"a body without Content-Length that is not the client's: {common.body_mutation.body[:120]!r}"
            ]
        return []
    body = common.body_mutation.body
    problems = []
    if not has_body or lengths != [str(len(body))]:
        problems.append(f"Content-Length {lengths} for a body of {len(body)} bytes")
    return problems + _rewritten_problems(world, bodies, body)


def _streamed_problems(
    world: FuzzWorld, bodies: list[bytes], replies: Sequence[pb.ProcessingResponse], ended_ok: bool
) -> list[str]:
    """Full duplex: the body handed back in chunks after the headers reply that routed it.

    A stream the server ended with an error (a garbage message after the body) may stop before the
    last chunk went out; Envoy then fails the request, so only a body that was finished (the stream
    ended OK, or its last chunk says end of stream) must match the Content-Length it was sent with.
    """
    lengths = [
        value
        for reply in replies
        if reply.WhichOneof("response") == "request_headers"
        for value in _set_header(reply.request_headers.response, "content-length")
    ]
    chunks = [
        reply.request_body.response.body_mutation.streamed_response
        for reply in replies
        if reply.WhichOneof("response") == "request_body"
        and reply.request_body.response.body_mutation.HasField("streamed_response")
    ]
    problems = []
    if any(chunk.end_of_stream for chunk in chunks[:-1]):
        problems.append("a streamed body chunk ends the body before the last one")
    if not lengths:
        return problems
    body = b"".join(chunk.body for chunk in chunks)
    finished = ended_ok or bool(chunks and chunks[-1].end_of_stream)
    if finished and lengths != [str(len(body))]:
        problems.append(f"Content-Length {lengths} for a streamed body of {len(body)} bytes")
    if body in bodies or not finished:
        return problems  # handed back as the client sent it, or cut off with the stream
    return problems + _rewritten_problems(world, bodies, body)


def _rewritten_problems(world: FuzzWorld, bodies: list[bytes], body: bytes) -> list[str]:
    try:
        rewritten = _strict_json(body)
    except (ValueError, RecursionError) as exc:
        return [f"rewritten body is not strict JSON ({exc}): {body[:120]!r}"]
    model = rewritten.get("model") if isinstance(rewritten, dict) else None
    requested = [m for m in map(_requested_model, bodies) if isinstance(m, str) and m in world.models]
    if not any(model in world.models[name] for name in requested):
        return [f"rewritten model {model!r} is not a target of the requested {requested}"]
    return []


def _set_header(common: pb.CommonResponse, name: str) -> list[str]:
    """Every value a reply's header mutation sets for ``name`` (lower case), raw or not."""
    return [
        (o.header.raw_value or o.header.value.encode()).decode(errors="replace")
        for o in common.header_mutation.set_headers
        if o.header.key.lower() == name
    ]
