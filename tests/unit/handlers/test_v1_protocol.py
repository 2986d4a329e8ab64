"""The v1 request protocol (upstream v1.x, as its test envoy.yaml deploys it), on both transports.

- the destination header and `envoy.lb` metadata carry a comma list: the pick, then fallbacks
  from the same ranking (`destination_fallbacks` of them);
- the proxy's subset hint (metadata `envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`,
  a comma list or a list of strings, `ip` or `ip:port`) limits the candidates; none left is 503;
  `endpoint_subset_filter=False` (`--disable-endpoint-subset-filter`) ignores it;
- a request whose headers end the stream is routed from its headers, within the subset;
- upstream's test plugins, when a config names them (`epp.handlers.conformance`): the request
  header `test-epp-endpoint-selection` limits the candidates (none without it: 503), and the
  response headers carry back the endpoint the proxy reported as served;
- FULL_DUPLEX_STREAMED response bodies: each chunk is handed back at once in `streamed_response`
  (Envoy forwards nothing else), and token usage is still read from JSON and SSE bodies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.config import GRPCIO_TRANSPORT, H2_TRANSPORT, ConformanceHooks
from epp.handlers.conformance import ENDPOINT_SELECTION_HEADER, SERVED_RESULT_HEADER
from epp.handlers.responses import STREAMED_CHUNK_BYTES, streamed_body
from epp.handlers.served import SERVED_KEY, SERVED_NAMESPACE
from epp.handlers.subset import SUBSET_KEY, SUBSET_NAMESPACE
from epp.handlers.usage import SseUsageScanner

from .support import DEST, JSON, SSE, Env, body, exchange, headers, immediate, mutation, serving

TRANSPORTS = [H2_TRANSPORT, GRPCIO_TRANSPORT]
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
COMPLETION = {"model": "food-review", "prompt": "Write a review", "max_tokens": 10}
GET = {":method": "GET", ":path": "/v1/models"}
NUMBER = object()  # a subset hint of neither protocol form (a number)
Hint = str | list[str] | object | None


def three_pods(**knobs: object) -> Env:
    env = Env(**knobs)  # type: ignore[arg-type]
    return (
        env.pool()
        .model("food-review")
        .pod("pod-1", "10.0.0.1")
        .pod("pod-2", "10.0.0.2")
        .pod("pod-3", "10.0.0.3")
    )


def request_headers(
    hdrs: dict[str, str] | None = None, *, eos: bool = False, subset: Hint = None, duplex: bool = True
) -> pb.ProcessingRequest:
    """Request headers as Envoy sends them in v1 mode: FULL_DUPLEX_STREAMED both ways (unless
    `duplex` is False: the v1alpha2 BUFFERED set-up), and the subset hint in metadata_context."""
    message = headers(hdrs, eos=eos)
    if duplex:
        message.protocol_config.request_body_mode = FULL_DUPLEX
        message.protocol_config.response_body_mode = FULL_DUPLEX
    if subset is not None:
        value = message.metadata_context.filter_metadata[SUBSET_NAMESPACE].fields[SUBSET_KEY]
        if subset is NUMBER:
            value.number_value = 3
        elif isinstance(subset, str):
            value.string_value = subset
        else:
            assert isinstance(subset, list)
            value.list_value.SetInParent()
            for item in subset:
                value.list_value.values.add().string_value = item
    return message


async def _streamed(
    channel: grpc.aio.Channel, messages: Sequence[pb.ProcessingRequest]
) -> list[pb.ProcessingResponse]:
    """Envoy's full duplex way: every message at once, then every reply until the stream ends."""

    async def requests() -> AsyncIterator[pb.ProcessingRequest]:
        for message in messages:
            yield message

    call = pb_grpc.ExternalProcessorStub(channel).Process(requests())
    replies = [reply async for reply in call]
    assert await call.code() == grpc.StatusCode.OK, await call.details()
    return replies


def run(
    env: Env, *messages: pb.ProcessingRequest, duplex: bool = True, transport: str = H2_TRANSPORT
) -> list[pb.ProcessingResponse]:
    """The stream as Envoy drives it: all at once in full duplex, else one message per reply."""

    async def scenario() -> list[pb.ProcessingResponse]:
        async with serving(env.servicer(), transport) as channel:
            if duplex:
                return await _streamed(channel, messages)
            result = await exchange(channel, messages)
            assert result.code == grpc.StatusCode.OK, result.details
            return result.replies

    return asyncio.run(scenario())


def routed_to(reply: pb.ProcessingResponse) -> str:
    """The destination of a routing reply, checked to be the same in the header and the metadata."""
    m = mutation(reply)
    header = dict(m.set_headers)[DEST]
    assert m.metadata == {"envoy.lb": {DEST: header}}
    assert DEST in m.removed, "the client's own hint is removed"
    return header


def routing_reply(replies: list[pb.ProcessingResponse]) -> pb.ProcessingResponse:
    """The reply carrying the decision: request headers in full duplex, the body reply in BUFFERED."""
    for reply in replies:
        if reply.WhichOneof("response") in ("request_headers", "request_body") and DEST in dict(
            mutation(reply).set_headers
        ):
            return reply
    raise AssertionError(f"no routing reply in {replies}")


# --- the destination comma list ------------------------------------------------------------------
def test_a_subset_hint_of_neither_form_is_noted_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="epp.handlers"):
        run(three_pods(), request_headers(subset=NUMBER), body(COMPLETION))
    assert "ignoring a subset hint of kind number_value" in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("duplex", [True, False], ids=["full-duplex", "buffered"])
@pytest.mark.parametrize(
    ("fallbacks", "expected"),
    [
        pytest.param(0, "10.0.0.2:8000", id="no-fallbacks-the-pick-alone"),
        pytest.param(1, "10.0.0.2:8000,10.0.0.1:8000", id="one-fallback"),
        pytest.param(2, "10.0.0.2:8000,10.0.0.1:8000,10.0.0.3:8000", id="two-fallbacks-pick-first"),
        pytest.param(5, "10.0.0.2:8000,10.0.0.1:8000,10.0.0.3:8000", id="more-fallbacks-than-pods"),
    ],
)
def test_destination_is_the_pick_then_the_fallbacks(fallbacks: int, expected: str, duplex: bool) -> None:
    env = three_pods(fallbacks=fallbacks)
    env.scheduler.pick = "pod-2"
    replies = run(env, request_headers(duplex=duplex), body(COMPLETION), duplex=duplex)
    assert routed_to(routing_reply(replies)) == expected
    assert env.scheduler.limits == [1 + fallbacks], "the scheduler is asked for the pick plus N"


def test_ipv6_endpoints_are_bracketed_in_the_list() -> None:
    env = Env(fallbacks=1).pool().model("food-review").pod("pod-1", "fd00::1").pod("pod-2", "10.0.0.2")
    replies = run(env, request_headers(), body(COMPLETION))
    assert routed_to(replies[0]) == "[fd00::1]:8000,10.0.0.2:8000"


def test_only_the_pick_counts_as_in_flight() -> None:
    env = three_pods(fallbacks=2, accounting=True)
    env.scheduler.pick = "pod-3"
    run(env, request_headers(), body(COMPLETION))
    # The stream has ended, so nothing is in flight any more; what counted must have been released.
    assert all(p.dispatched.count == 0 for p in env.datastore.pod_get_all())
    assert (
        env.sample(
            "inference_model_request_total", {"model_name": "food-review", "target_model_name": "food-review"}
        )
        == 1
    )


# --- the subset hint -----------------------------------------------------------------------------
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("subset", "candidates"),
    [
        pytest.param(None, ["pod-1", "pod-2", "pod-3"], id="no-hint-every-pod"),
        pytest.param("10.0.0.2", ["pod-2"], id="string-ip"),
        pytest.param("10.0.0.1:8000, 10.0.0.3:8000", ["pod-1", "pod-3"], id="string-ip-port-list"),
        pytest.param(["10.0.0.3", "10.0.0.1:8000"], ["pod-1", "pod-3"], id="list-of-ip-and-ip-port"),
        pytest.param("10.0.0.2,10.0.0.9", ["pod-2"], id="partly-outside-the-pool"),
        pytest.param(NUMBER, ["pod-1", "pod-2", "pod-3"], id="neither-form-is-ignored"),
    ],
)
def test_the_subset_limits_the_candidates(subset: Hint, candidates: list[str], transport: str) -> None:
    env = three_pods()
    replies = run(env, request_headers(subset=subset), body(COMPLETION), transport=transport)
    assert env.scheduler.candidates == [candidates]
    assert routed_to(replies[0]).split(":")[0] in {f"10.0.0.{name[-1]}" for name in candidates}


@pytest.mark.parametrize("duplex", [True, False], ids=["full-duplex", "buffered"])
@pytest.mark.parametrize(
    "subset",
    [
        pytest.param("10.0.0.9", id="no-intersection"),
        pytest.param("10.0.0.2:9000", id="right-ip-wrong-port"),
        pytest.param("", id="empty-string"),
        pytest.param([], id="empty-list"),
    ],
)
def test_a_subset_without_candidates_is_503(subset: Hint, duplex: bool) -> None:
    env = three_pods()
    replies = run(env, request_headers(subset=subset, duplex=duplex), body(COMPLETION), duplex=duplex)
    status, message, _ = immediate(replies[-1])
    assert status == 503
    assert "subset" in message
    assert env.scheduler.requests == [], "nothing is scheduled"


@pytest.mark.parametrize(
    "subset", [pytest.param("10.0.0.9", id="would-be-503"), pytest.param("10.0.0.2", id="would-narrow")]
)
def test_a_disabled_subset_filter_ignores_the_hint(subset: str) -> None:
    env = three_pods(subset_filter=False)
    replies = run(env, request_headers(subset=subset), body(COMPLETION))
    assert env.scheduler.candidates == [["pod-1", "pod-2", "pod-3"]]
    assert routed_to(replies[0]) == "10.0.0.1:8000"


def test_the_subset_filter_is_on_unless_turned_off() -> None:
    """A servicer built without `endpoint_subset_filter` honours the hint, as the flag's default does."""
    env = three_pods(subset_filter=None)
    replies = run(env, request_headers(subset="10.0.0.2"), body(COMPLETION))
    assert env.scheduler.candidates == [["pod-2"]]
    assert routed_to(replies[0]) == "10.0.0.2:8000"


# --- upstream's test plugins (gateway conformance) -------------------------------------------------
SELECTING = ConformanceHooks(endpoint_selection_header=True)
ECHOING = ConformanceHooks(served_endpoint_header=True)


def selecting(value: str | None) -> pb.ProcessingRequest:
    hdrs = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}
    if value is not None:
        hdrs[ENDPOINT_SELECTION_HEADER] = value
    return request_headers(hdrs)


@pytest.mark.parametrize(
    ("value", "candidates"),
    [
        pytest.param("10.0.0.3", ["pod-3"], id="an-ip"),
        pytest.param("10.0.0.1:8000, 10.0.0.2", ["pod-1", "pod-2"], id="ip-port-and-ip"),
        pytest.param("10.0.0.2,10.0.0.9", ["pod-2"], id="partly-outside-the-pool"),
    ],
)
def test_the_selection_header_limits_the_candidates(value: str, candidates: list[str]) -> None:
    env = three_pods(conformance=SELECTING)
    replies = run(env, selecting(value), body(COMPLETION))
    assert env.scheduler.candidates == [candidates]
    assert routed_to(replies[0]).split(":")[0] in {f"10.0.0.{name[-1]}" for name in candidates}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        pytest.param(None, "(empty)", id="no-header"),
        pytest.param("10.0.0.2:9000", "10.0.0.2:9000", id="right-ip-wrong-port"),
        pytest.param("10.0.0.9", "10.0.0.9", id="outside-the-pool"),
    ],
)
def test_a_selection_naming_no_ready_endpoint_is_503(value: str | None, named: str) -> None:
    env = three_pods(conformance=SELECTING)
    replies = run(env, selecting(value), body(COMPLETION))
    status, message, _ = immediate(replies[-1])
    assert (status, ENDPOINT_SELECTION_HEADER in message) == (503, True), message
    assert message.endswith(f"header ({named})"), message
    assert env.scheduler.requests == [], "nothing is scheduled"


def test_without_the_plugin_the_selection_header_is_only_a_header() -> None:
    env = three_pods()
    run(env, selecting("10.0.0.9"), body(COMPLETION))
    assert env.scheduler.candidates == [["pod-1", "pod-2", "pod-3"]]


def served_headers(served: str | None, *, namespace: bool = True) -> pb.ProcessingRequest:
    message = headers({":status": "200", "content-type": "application/json"}, response=True)
    if namespace:
        message.metadata_context.filter_metadata[SERVED_NAMESPACE].SetInParent()
    if served is not None:
        message.metadata_context.filter_metadata[SERVED_NAMESPACE].update({SERVED_KEY: served})
    return message


@pytest.mark.parametrize(
    ("report", "echoed"),
    [
        pytest.param(served_headers("10.0.0.2:8000"), "10.0.0.2:8000", id="served-endpoint"),
        pytest.param(served_headers(None), f"fail: missing {SERVED_KEY} metadata", id="no-served-key"),
        pytest.param(
            served_headers(None, namespace=False),
            f"fail: missing {SERVED_NAMESPACE} metadata",
            id="no-lb-metadata",
        ),
    ],
)
def test_the_served_endpoint_is_echoed_on_the_response(report: pb.ProcessingRequest, echoed: str) -> None:
    env = three_pods(conformance=ECHOING)
    replies = run(env, request_headers(), body(COMPLETION), report)
    [reply] = [r for r in replies if r.WhichOneof("response") == "response_headers"]
    assert dict(mutation(reply).set_headers) == {SERVED_RESULT_HEADER: echoed}


def test_without_the_plugin_the_response_headers_are_continued_unchanged() -> None:
    env = three_pods()
    replies = run(env, request_headers(), body(COMPLETION), served_headers("10.0.0.2:8000"))
    [reply] = [r for r in replies if r.WhichOneof("response") == "response_headers"]
    assert dict(mutation(reply).set_headers) == {}


# --- header-only requests ------------------------------------------------------------------------
@pytest.mark.parametrize("duplex", [True, False], ids=["full-duplex", "buffered"])
@pytest.mark.parametrize(
    ("subset", "fallbacks", "allowed", "length"),
    [
        pytest.param(None, 0, {"10.0.0.1", "10.0.0.2", "10.0.0.3"}, 1, id="any-pod"),
        pytest.param(None, 2, {"10.0.0.1", "10.0.0.2", "10.0.0.3"}, 3, id="any-pod-with-fallbacks"),
        pytest.param("10.0.0.3", 2, {"10.0.0.3"}, 1, id="within-the-subset"),
        pytest.param(["10.0.0.1", "10.0.0.2"], 2, {"10.0.0.1", "10.0.0.2"}, 2, id="within-a-subset-of-two"),
    ],
)
def test_a_header_only_request_is_routed_from_its_headers(
    subset: Hint, fallbacks: int, allowed: set[str], length: int, duplex: bool
) -> None:
    env = three_pods(fallbacks=fallbacks)
    replies = run(env, request_headers(GET, eos=True, subset=subset, duplex=duplex), duplex=duplex)
    assert [r.WhichOneof("response") for r in replies] == ["request_headers"]
    endpoints = routed_to(replies[0]).split(",")
    assert len(endpoints) == length
    assert len(set(endpoints)) == length, "no endpoint twice"
    assert {e.split(":")[0] for e in endpoints} <= allowed
    assert all(e.endswith(":8000") for e in endpoints)


def test_a_header_only_request_outside_every_subset_is_503() -> None:
    replies = run(three_pods(), request_headers(GET, eos=True, subset="10.0.0.7"))
    status, message, _ = immediate(replies[0])
    assert (status, "subset" in message) == (503, True)


# --- FULL_DUPLEX_STREAMED responses --------------------------------------------------------------
def response(content_type: str, chunks: list[bytes], *, trailers: bool = False) -> list[pb.ProcessingRequest]:
    """Response headers, the body in `chunks` (end_of_stream on the last unless trailers follow)."""
    messages = [headers({":status": "200", "content-type": content_type}, response=True)]
    last = len(chunks) - 1
    messages += [body(c, eos=i == last and not trailers, response=True) for i, c in enumerate(chunks)]
    if trailers:
        messages.append(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    return messages


def response_side(replies: list[pb.ProcessingResponse]) -> list[pb.ProcessingResponse]:
    return [
        r
        for r in replies
        if r.WhichOneof("response") in ("response_headers", "response_body", "response_trailers")
    ]


def echoed(replies: list[pb.ProcessingResponse]) -> list[tuple[bytes, bool]]:
    """(body, end_of_stream) of each response body reply, checked to be a streamed_response."""
    out = []
    for reply in replies:
        if reply.WhichOneof("response") == "response_body":
            mutation_ = reply.response_body.response.body_mutation
            assert mutation_.WhichOneof("mutation") == "streamed_response", reply
            out.append((mutation_.streamed_response.body, mutation_.streamed_response.end_of_stream))
    return out


def tokens(env: Env) -> tuple[float | None, float | None]:
    labels = {"model_name": "food-review", "target_model_name": "food-review"}
    return (
        env.sample("inference_model_input_tokens_sum", labels),
        env.sample("inference_model_output_tokens_sum", labels),
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("content_type", "chunks", "trailers", "usage"),
    [
        pytest.param("application/json", [JSON[:17], JSON[17:]], False, (5, 9), id="json-split"),
        pytest.param("application/json", [JSON], True, (5, 9), id="json-then-trailers"),
        pytest.param(
            "text/event-stream",
            [SSE[:40], SSE[40 : SSE.index(b'"completion')], SSE[SSE.index(b'"completion') :]],
            False,
            (12, 34),
            id="sse-usage-split-across-chunks",
        ),
        pytest.param("text/event-stream", [SSE, b""], False, (12, 34), id="sse-then-empty-end"),
        pytest.param(
            "application/json", [b"{oops", b" not json"], False, (None, None), id="invalid-json-no-usage"
        ),
    ],
)
def test_full_duplex_response_chunks_come_back_at_once_and_usage_is_counted(
    content_type: str,
    chunks: list[bytes],
    trailers: bool,
    usage: tuple[int | None, int | None],
    transport: str,
) -> None:
    env = three_pods()
    replies = run(
        env,
        request_headers(),
        body(COMPLETION),
        *response(content_type, chunks, trailers=trailers),
        transport=transport,
    )
    side = response_side(replies)
    kinds = [
        "response_headers",
        *["response_body"] * len(chunks),
        *(["response_trailers"] if trailers else []),
    ]
    assert [r.WhichOneof("response") for r in side] == kinds
    assert mutation(side[0]).set_headers == frozenset()
    ends = [i == len(chunks) - 1 and not trailers for i in range(len(chunks))]
    assert echoed(side) == list(zip(chunks, ends, strict=True)), "each chunk back unchanged, in order"
    assert tokens(env) == usage
    labels = {"model_name": "food-review", "target_model_name": "food-review"}
    assert env.sample("inference_model_response_sizes_sum", labels) == sum(map(len, chunks))


def test_a_big_response_chunk_comes_back_in_chunks_envoy_accepts() -> None:
    big = b'{"text": "' + b"x" * (2 * STREAMED_CHUNK_BYTES) + b'"}'
    replies = run(three_pods(), request_headers(), body(COMPLETION), *response("application/json", [big]))
    pieces = echoed(replies)
    assert b"".join(p for p, _ in pieces) == big
    assert [end for _, end in pieces] == [False, False, True]
    assert all(len(p) <= STREAMED_CHUNK_BYTES for p, _ in pieces)


def test_a_response_chunk_is_handed_back_even_when_observing_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: SseUsageScanner, chunk: bytes) -> None:
        raise RuntimeError("planted")

    monkeypatch.setattr(SseUsageScanner, "feed", broken)
    replies = run(three_pods(), request_headers(), body(COMPLETION), *response("text/event-stream", [SSE]))
    assert echoed(replies) == [(SSE, True)]


def test_without_full_duplex_the_response_is_continued_unchanged() -> None:
    # The v1alpha2 set-up (response body STREAMED): replies are CONTINUE, Envoy forwards the body itself.
    env = three_pods()
    replies = run(
        env,
        request_headers(duplex=False),
        body(COMPLETION),
        *response("application/json", [JSON]),
        duplex=False,
    )
    side = response_side(replies)
    assert [r.WhichOneof("response") for r in side] == ["response_headers", "response_body"]
    assert not side[1].response_body.response.HasField("body_mutation")
    assert tokens(env) == (5, 9)


@pytest.mark.parametrize(
    ("subset", "endpoints"),
    [
        pytest.param("10.0.0.1:8001", {"10.0.0.1:8001"}, id="ip-port-one-rank-of-the-pod"),
        pytest.param("10.0.0.1", {"10.0.0.1:8000", "10.0.0.1:8001"}, id="ip-every-rank-of-the-pod"),
        pytest.param(
            "10.0.0.2:8000,10.0.0.1:8001", {"10.0.0.2:8000", "10.0.0.1:8001"}, id="ranks-of-two-pods"
        ),
    ],
)
def test_the_subset_selects_endpoints_of_a_pool_with_two_target_ports(
    subset: str, endpoints: set[str]
) -> None:
    # A v1 pool with ports 8000 and 8001: one endpoint per pod and port (data-parallel ranks).
    env = Env(fallbacks=3).pool_v1(8000, 8001).pod("pod-1", "10.0.0.1").pod("pod-2", "10.0.0.2")
    replies = run(env, request_headers(subset=subset), body(COMPLETION))
    assert set(routed_to(replies[0]).split(",")) == endpoints


@pytest.mark.parametrize(("size", "pieces"), [(STREAMED_CHUNK_BYTES, 1), (STREAMED_CHUNK_BYTES + 1, 2)])
def test_a_body_is_handed_back_in_chunks_of_at_most_the_limit(size: int, pieces: int) -> None:
    replies = [
        pb.ProcessingResponse.FromString(r) for r in streamed_body(b"x" * size, True, phase="response_body")
    ]
    chunks = [r.response_body.response.body_mutation.streamed_response for r in replies]
    assert [len(c.body) for c in chunks][:pieces] == [
        min(size, STREAMED_CHUNK_BYTES),
        *([1] if pieces == 2 else []),
    ]
    assert len(chunks) == pieces
    assert [c.end_of_stream for c in chunks] == [False] * (pieces - 1) + [True]
