"""The ext_proc servicer driven over a real grpc.aio channel with real ProcessingRequest messages."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.config import GRPCIO_TRANSPORT, H2_TRANSPORT
from epp.errors import ResourceExhausted
from epp.handlers.usage import MAX_JSON_RESPONSE_BYTES
from epp.metrics import UNKNOWN_MODEL, RequestMetrics
from harness.base.eventually import eventually_async

from .support import (
    DEST,
    Env,
    body,
    exchange,
    headers,
    immediate,
    mutation,
    raw_exchange,
    serving,
)

COMPLETION = {"model": "food-review", "prompt": "Write a review: crème brûlée", "max_tokens": 100}


def routed_env(*targets: tuple[str, int | None]) -> Env:
    return Env().pool().model("food-review", *targets).pod("pod-1", "10.0.0.1").pod("pod-2", "10.0.0.2")


def run_exchange(env: Env, *messages: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
    async def scenario() -> list[pb.ProcessingResponse]:
        async with serving(env.servicer()) as channel:
            result = await exchange(channel, messages)
            assert result.code == grpc.StatusCode.OK, result.details
            return result.replies

    return asyncio.run(scenario())


def test_request_headers_are_continued_without_mutation() -> None:
    replies = run_exchange(routed_env(), headers())
    assert replies[0].WhichOneof("response") == "request_headers"
    m = mutation(replies[0])
    assert (m.set_headers, m.removed, m.body) == (frozenset(), frozenset(), None)


def test_client_supplied_destination_header_is_removed() -> None:
    hdrs = {":method": "POST", ":path": "/v1/completions", DEST: "6.6.6.6:22"}
    replies = run_exchange(routed_env(), headers(hdrs))
    assert mutation(replies[0]).removed == {DEST}


def test_same_target_forwards_original_bytes_with_destination_header_and_metadata() -> None:
    env = routed_env()
    env.scheduler.pick = "pod-2"
    raw = json.dumps(COMPLETION, indent=2).encode()  # odd formatting must survive untouched
    replies = run_exchange(env, headers(), body(raw))
    assert replies[1].WhichOneof("response") == "request_body"
    m = mutation(replies[1])
    assert m.set_headers == {(DEST, "10.0.0.2:8000")}
    assert m.removed == {DEST}
    assert m.body is None
    assert m.clear_route_cache
    assert m.metadata == {"envoy.lb": {DEST: "10.0.0.2:8000"}}


def test_different_target_rewrites_model_and_content_length_byte_exact() -> None:
    env = routed_env(("food-review-lora", None))
    sent = '{"prompt": "Write a review: crème brûlée",  "model" : "food-review", "max_tokens": 100}'
    replies = run_exchange(env, headers(), body(sent.encode()))
    m = mutation(replies[1])
    # Only the model's value changes: every other byte is the client's (spacing, order, raw UTF-8).
    expected = sent.replace('"food-review"', '"food-review-lora"').encode()
    assert m.body == expected
    assert m.set_headers == {(DEST, "10.0.0.1:8000"), ("content-length", str(len(expected)))}
    assert len(expected) != len(expected.decode())  # the length counts bytes, not characters
    assert env.scheduler.requests[0].target_model == "food-review-lora"


class _LastSlot(random.Random):
    """Every weighted draw lands on the last slot: with weights 50/50, always the second target."""

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        return start - 1


def split_targets(env: Env, requests: int) -> list[str]:
    """The target model of each of `requests` completions through one servicer."""

    async def scenario() -> None:
        async with serving(env.servicer()) as channel:
            for _ in range(requests):
                result = await exchange(channel, [headers(), body(COMPLETION)])
                assert result.code == grpc.StatusCode.OK, result.details

    asyncio.run(scenario())
    return [request.target_model for request in env.scheduler.requests]


def test_weighted_splits_draw_from_the_rng_the_servicer_is_given() -> None:
    env = routed_env(("a", 50), ("b", 50))
    env.rng = _LastSlot()
    assert split_targets(env, 20) == ["b"] * 20


def test_a_servicer_given_no_rng_draws_from_its_own() -> None:
    env = routed_env(("a", 50), ("b", 50))
    env.rng = None
    assert set(split_targets(env, 64)) == {"a", "b"}  # one-sided with probability 2**-63


def test_scheduler_gets_model_target_and_criticality() -> None:
    env = Env().pool().model("chat", criticality="Critical").pod("pod-1", "10.0.0.1")
    run_exchange(env, headers(), body({"model": "chat", "prompt": "hi"}))
    (request,) = env.scheduler.requests
    assert (request.model, request.target_model, request.critical) == ("chat", "chat", True)


def test_empty_metadata_namespace_gives_the_flat_form() -> None:
    env = routed_env()
    env.metadata_namespace = ""
    replies = run_exchange(env, headers(), body(COMPLETION))
    assert mutation(replies[1]).metadata == {DEST: "10.0.0.1:8000"}


def test_pool_port_is_read_per_request() -> None:
    env = routed_env()
    first = run_exchange(env, headers(), body(COMPLETION))
    env.pool(port=9000)
    second = run_exchange(env, headers(), body(COMPLETION))
    assert mutation(first[1]).metadata["envoy.lb"][DEST] == "10.0.0.1:8000"
    assert mutation(second[1]).metadata["envoy.lb"][DEST] == "10.0.0.1:9000"


def test_split_body_is_held_then_forwarded_whole() -> None:
    raw = json.dumps(COMPLETION).encode()
    parts = [raw[:10], raw[10:30], raw[30:]]
    replies = run_exchange(
        routed_env(), headers(), body(parts[0], eos=False), body(parts[1], eos=False), body(parts[2])
    )
    assert [mutation(r).clear_body for r in replies[1:3]] == [True, True]
    final = mutation(replies[3])
    assert final.body == raw
    assert (DEST, "10.0.0.1:8000") in final.set_headers


def test_buffered_mode_body_without_end_of_stream_is_the_whole_body() -> None:
    first = headers()
    first.protocol_config.request_body_mode = 2  # BUFFERED
    replies = run_exchange(routed_env(), first, body(COMPLETION, eos=False))
    assert mutation(replies[1]).metadata == {"envoy.lb": {DEST: "10.0.0.1:8000"}}


def test_bodyless_request_is_routed_at_the_headers() -> None:
    replies = run_exchange(routed_env(), headers({":method": "GET", ":path": "/v1/models"}, eos=True))
    assert replies[0].WhichOneof("response") == "request_headers"
    m = mutation(replies[0])
    (endpoint,) = [v for k, v in m.set_headers if k == DEST]
    assert endpoint in {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert {k for k, _ in m.set_headers} == {DEST}  # no Content-Length
    assert m.metadata == {"envoy.lb": {DEST: endpoint}}


def test_trailers_are_continued() -> None:
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    resp_trailers = pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
    replies = run_exchange(routed_env(), headers(), body(COMPLETION), trailers, resp_trailers)
    assert [r.WhichOneof("response") for r in replies[2:]] == ["request_trailers", "response_trailers"]


@pytest.mark.parametrize(
    ("setup", "payload", "status", "message", "code"),
    [
        pytest.param(None, b"{not json", 400, "invalid JSON request body: ", "BadRequest", id="invalid-json"),
        pytest.param(None, b"[1, 2]", 400, "invalid JSON request body: ", "BadRequest", id="not-an-object"),
        pytest.param(None, b"", 400, "invalid JSON request body: ", "BadRequest", id="empty-body"),
        pytest.param(None, b'{"prompt": "x"}', 400, 'missing or non-string "model"', "BadRequest",
                     id="missing-model"),
        pytest.param(None, b'{"model": 7}', 400, 'missing or non-string "model"', "BadRequest",
                     id="non-string-model"),
        pytest.param(None, b'{"model": "nope"}', 404, "model nope not found", "BadConfiguration",
                     id="unknown-model"),
        pytest.param("shed", None, 429, "pool saturated", "InferencePoolResourceExhausted", id="shed"),
        pytest.param("no-pods", None, 503, "no ready endpoints", "ServiceUnavailable", id="no-pods"),
        pytest.param("no-pool", None, 503, "no InferencePool", "ServiceUnavailable", id="no-pool"),
        pytest.param("boom", None, 500, "internal error", "Internal", id="internal"),
    ],
)  # fmt: skip
def test_errors_become_immediate_responses(
    setup: str | None, payload: bytes | None, status: int, message: str, code: str
) -> None:
    env = routed_env()
    if setup == "shed":
        env.scheduler.error = ResourceExhausted("pool saturated")
    elif setup == "no-pods":
        env = Env().pool().model("food-review")
    elif setup == "no-pool":
        env = Env().model("food-review").pod("pod-1", "10.0.0.1")
    elif setup == "boom":
        env.scheduler.error = RuntimeError("bug")
    replies = run_exchange(env, headers(), body(payload if payload is not None else COMPLETION))
    got_status, got_message, got_headers = immediate(replies[-1])
    assert got_status == status
    assert got_message.startswith(message) or message in got_message
    assert "\n" not in got_message
    assert got_headers == {"content-type": "application/json"}
    # Labels name the model once it is known: not when the body was unreadable, nor without a pool
    # (checked first), and an unknown name is counted under the one UNKNOWN_MODEL value.
    known = payload is None and setup != "no-pool"
    model_label = "food-review" if known else (UNKNOWN_MODEL if status == 404 else "")
    errors = env.registry.get_sample_value(
        "inference_model_request_error_total",
        {"model_name": model_label, "target_model_name": "food-review" if known else "", "error_code": code},
    )
    assert errors == 1


def test_unexpected_exception_is_logged_with_traceback(caplog: pytest.LogCaptureFixture) -> None:
    env = routed_env()
    env.scheduler.error = RuntimeError("scheduler bug")
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    with caplog.at_level(logging.ERROR, logger="epp.handlers"):
        replies = run_exchange(env, headers(), body(COMPLETION), trailers)
    assert len(replies) == 2, "the 500 ended the stream: nothing after it is answered"
    assert immediate(replies[-1])[:2] == (500, "internal error in the endpoint picker")
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    text = record.getMessage()
    lines = text.splitlines()
    assert lines[:2] == ["internal error handling request_body:", "Traceback (most recent call last):"]
    assert lines[2].startswith('  File "'), "the traceback as Python prints it"
    assert "RuntimeError: scheduler bug" in text


def test_routes_and_rejections_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    env = routed_env(("food-review-lora", None))
    with caplog.at_level(logging.DEBUG, logger="epp.handlers"):
        run_exchange(env, headers(), body(COMPLETION))
        rejected = run_exchange(env, headers(), body({"model": "nope", "prompt": "x"}))
    status, message, _ = immediate(rejected[-1])
    assert [r.getMessage() for r in caplog.records if r.name.startswith("epp.handlers")] == [
        "routed model=food-review target=food-review-lora to 10.0.0.1:8000",
        f"request rejected with {status}: {message}",
    ]


def test_bodyless_request_without_pods_is_503() -> None:
    env = Env().pool()
    replies = run_exchange(env, headers({":method": "GET"}, eos=True))
    assert immediate(replies[0])[0] == 503


def test_model_name_with_newline_stays_one_line() -> None:
    replies = run_exchange(routed_env(), headers(), body({"model": "evil\nmodel"}))
    status, message, _ = immediate(replies[-1])
    assert (status, message) == (404, "model evil model not found")


@pytest.mark.parametrize("transport", [H2_TRANSPORT, GRPCIO_TRANSPORT])
@pytest.mark.parametrize(
    ("payload", "details"),
    [
        pytest.param(b"\xff\xfe garbage", "undecodable ProcessingRequest", id="undecodable-bytes"),
        pytest.param(
            pb.ProcessingRequest().SerializeToString(), "unsupported ProcessingRequest: no message set",
            id="no-message-set",
        ),
        pytest.param(b"\x08\x01", "unsupported ProcessingRequest: no message set", id="unknown-field-only"),
    ],
)  # fmt: skip
def test_garbage_gets_an_error_and_the_server_keeps_serving(
    payload: bytes, details: str, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with serving(routed_env().servicer(), transport) as channel:
            with caplog.at_level(logging.WARNING, logger="epp.handlers"):
                bad = await raw_exchange(channel, payload)
            assert bad.code == grpc.StatusCode.INVALID_ARGUMENT
            assert details in bad.details, "the gRPC status says what was wrong"
            warned = [r.getMessage() for r in caplog.records if r.name.startswith("epp.handlers")]
            assert warned == [f"ext_proc protocol error: {bad.details}"]
            assert bad.replies == []
            good = await exchange(channel, [headers(), body(COMPLETION)])
            assert good.code == grpc.StatusCode.OK
            assert mutation(good.replies[1]).metadata == {"envoy.lb": {DEST: "10.0.0.1:8000"}}

    asyncio.run(scenario())


def test_routed_request_counts_and_running_gauge_returns_to_zero() -> None:
    env = routed_env(("food-review-lora", None))
    run_exchange(env, headers(), body(COMPLETION))
    labels = {"model_name": "food-review", "target_model_name": "food-review-lora"}
    assert env.sample("inference_model_request_total", labels) == 1
    assert env.sample("inference_model_request_sizes_count", labels) == 1
    assert env.sample("inference_model_request_sizes_sum", labels) == len(json.dumps(COMPLETION).encode())
    assert env.sample("inference_model_running_requests", {"model_name": "food-review"}) == 0


def test_client_cancel_is_quiet_and_releases_the_running_gauge(caplog: pytest.LogCaptureFixture) -> None:
    env = routed_env()

    async def scenario() -> None:
        async with serving(env.servicer()) as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(headers())
            await call.read()
            await call.write(body(COMPLETION))
            await call.read()
            running = {"model_name": "food-review"}
            assert env.sample("inference_model_running_requests", running) == 1
            call.cancel()

            async def released() -> None:
                assert env.sample("inference_model_running_requests", running) == 0

            await eventually_async(released)

    with caplog.at_level(logging.DEBUG):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("epp")]


def _response_messages(
    content_type: str, chunks: list[bytes], status: str = "200"
) -> list[pb.ProcessingRequest]:
    msgs = [headers({":status": status, "content-type": content_type}, response=True)]
    msgs += [body(c, eos=i == len(chunks) - 1, response=True) for i, c in enumerate(chunks)]
    return msgs


def _tokens(env: Env) -> tuple[float | None, float | None]:
    labels = {"model_name": "food-review", "target_model_name": "food-review"}
    return (
        env.sample("inference_model_input_tokens_sum", labels),
        env.sample("inference_model_output_tokens_sum", labels),
    )


def test_sse_usage_split_across_chunks_is_found_and_body_untouched() -> None:
    stream = (
        b'data: {"choices":[{"text":"Hel"}],"usage":null}\n\n'
        b'data: {"choices":[{"text":"lo"}],"usage":null}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}\n\n'
        b"data: [DONE]\n\n"
    )
    cut = stream.index(b'"completion_tokens"')
    chunks = [stream[:40], stream[40:cut], stream[cut:]]
    env = routed_env()
    replies = run_exchange(env, headers(), body(COMPLETION), *_response_messages("text/event-stream", chunks))
    for reply in replies[2:]:
        m = mutation(reply)
        assert (m.body, m.clear_body, m.set_headers) == (None, False, frozenset())
    assert _tokens(env) == (12, 34)
    labels = {"model_name": "food-review", "target_model_name": "food-review"}
    assert env.sample("inference_model_response_sizes_sum", labels) == len(stream)
    assert env.sample("inference_model_request_duration_seconds_count", labels) is not None


def test_json_usage_is_recorded() -> None:
    payload = json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}}).encode()
    env = routed_env()
    run_exchange(env, headers(), body(COMPLETION), *_response_messages("application/json", [payload]))
    assert _tokens(env) == (5, 9)


def test_invalid_response_json_is_passed_through_untouched() -> None:
    env = routed_env()
    replies = run_exchange(
        env, headers(), body(COMPLETION), *_response_messages("application/json", [b"{oops", b" not json"])
    )
    for reply in replies[2:]:
        m = mutation(reply)
        assert (m.body, m.clear_body) == (None, False)
    assert _tokens(env) == (None, None)  # no usage, nothing observed, no error
    labels = {"model_name": "food-review", "target_model_name": "food-review"}
    assert env.sample("inference_model_response_sizes_sum", labels) == len(b"{oops not json")


def test_model_server_error_status_is_counted_once() -> None:
    env = routed_env()
    run_exchange(env, headers(), body(COMPLETION), *_response_messages("application/json", [b"{}"], "500"))
    labels = {
        "model_name": "food-review",
        "target_model_name": "food-review",
        "error_code": "ModelServerError",
    }
    assert env.sample("inference_model_request_error_total", labels) == 1


def test_usage_is_sniffed_when_response_headers_are_skipped() -> None:
    env = routed_env()
    sse = b'data: {"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\ndata: [DONE]\n\n'
    run_exchange(env, headers(), body(COMPLETION), body(sse, response=True))
    assert _tokens(env) == (3, 4)


# --- the response side: what each response tells the metrics ---------------------------------------
ERRORS = {"model_name": "food-review", "target_model_name": "food-review", "error_code": "ModelServerError"}
LABELS = {"model_name": "food-review", "target_model_name": "food-review"}


@pytest.mark.parametrize(
    ("status", "errors"),
    [
        pytest.param("399", None, id="399-is-not-an-error"),
        pytest.param("400", 1, id="400-is-the-first-error"),
        pytest.param("503", 1, id="503"),
    ],
)
def test_a_response_status_from_400_counts_as_a_model_server_error(status: str, errors: int | None) -> None:
    env = routed_env()
    run_exchange(env, headers(), body(COMPLETION), *_response_messages("application/json", [b"{}"], status))
    assert env.sample("inference_model_request_error_total", ERRORS) == errors


@pytest.mark.parametrize("status", ["2xx", None])
def test_a_status_that_is_not_a_number_or_missing_is_no_error_and_no_failure(
    status: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    env = routed_env()
    response = _response_messages("application/json", [b"{}"], status or "")
    if status is None:
        response[0] = headers({"content-type": "application/json"}, response=True)
    with caplog.at_level(logging.WARNING):
        run_exchange(env, headers(), body(COMPLETION), *response)
    assert env.sample("inference_model_request_error_total", ERRORS) is None
    assert [r.getMessage() for r in caplog.records] == []


def test_an_unrouted_request_counts_no_model_server_error() -> None:
    """A request routed from its headers alone (no body, no model) is not a model's request."""
    env = routed_env()
    bodyless = headers({":method": "GET", ":path": "/v1/models"}, eos=True)
    run_exchange(env, bodyless, *_response_messages("application/json", [b"{}"], "500"))
    errors = {
        "model_name": UNKNOWN_MODEL,
        "target_model_name": UNKNOWN_MODEL,
        "error_code": "ModelServerError",
    }
    assert env.sample("inference_model_request_error_total", errors) is None


def test_the_request_duration_is_from_the_request_to_the_response_end() -> None:
    env = routed_env()  # each clock reading is 0.25 s after the one before
    run_exchange(env, headers(), body(COMPLETION), *_response_messages("application/json", [b"{}"]))
    duration = env.sample("inference_model_request_duration_seconds_sum", LABELS)
    assert duration is not None
    assert 0 < duration <= 10 * env.clock_step, duration


def test_a_response_ended_twice_is_counted_once() -> None:
    """The last chunk's end_of_stream, then trailers: one response."""
    env = routed_env()
    trailers = pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
    run_exchange(env, headers(), body(COMPLETION), *_response_messages("application/json", [b"{}"]), trailers)
    assert env.sample("inference_model_request_duration_seconds_count", LABELS) == 1
    assert env.sample("inference_model_response_sizes_count", LABELS) == 1


SSE_WITH_USAGE = b'data: {"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\ndata: [DONE]\n\n'


def test_the_content_type_decides_even_when_the_first_chunk_does_not_look_like_sse() -> None:
    env = routed_env()
    chunks = [SSE_WITH_USAGE[:2], SSE_WITH_USAGE[2:]]
    run_exchange(env, headers(), body(COMPLETION), *_response_messages("text/event-stream", chunks))
    assert _tokens(env) == (3, 4)


@pytest.mark.parametrize(
    ("first", "usage"),
    [
        pytest.param(b'{"usage":{"prompt_tokens":5,"completion_tokens":6}}', (5, 6), id="json"),
        pytest.param(b"\n\n" + SSE_WITH_USAGE, (3, 4), id="sse-after-blank-lines"),
    ],
)
def test_without_response_headers_the_first_bytes_tell_sse_from_json(
    first: bytes, usage: tuple[int, int]
) -> None:
    env = routed_env()
    run_exchange(env, headers(), body(COMPLETION), body(first, response=True))
    assert _tokens(env) == usage


def test_a_json_response_of_exactly_the_limit_is_still_read_for_usage() -> None:
    head = b'{"usage":{"prompt_tokens":2,"completion_tokens":8},"pad":"'
    payload = head + b"x" * (MAX_JSON_RESPONSE_BYTES - len(head) - 2) + b'"}'
    assert len(payload) == MAX_JSON_RESPONSE_BYTES
    piece = 1024 * 1024
    pieces = [payload[i : i + piece] for i in range(0, len(payload), piece)]
    env = routed_env()
    run_exchange(env, headers(), body(COMPLETION), *_response_messages("application/json", pieces))
    assert _tokens(env) == (2, 8)


class _FailingMetrics(RequestMetrics):
    def response_complete(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("metrics broke")


def test_an_observer_that_fails_is_logged_and_the_response_still_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = routed_env()
    env.request_metrics = _FailingMetrics
    with caplog.at_level(logging.ERROR):
        replies = run_exchange(
            env, headers(), body(COMPLETION), *_response_messages("application/json", [b"{}"])
        )
    assert [r.WhichOneof("response") for r in replies[2:]] == ["response_headers", "response_body"]
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "error observing response_body; response passed through" in record.getMessage()
    assert "RuntimeError: metrics broke" in record.getMessage()


def test_a_bodyless_request_without_a_pool_is_503_saying_so() -> None:
    replies = run_exchange(Env(), headers({":method": "GET"}, eos=True))
    assert immediate(replies[0])[:2] == (503, "no InferencePool is known to the endpoint picker")
