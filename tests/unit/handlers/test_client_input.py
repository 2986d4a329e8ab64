"""What a client sends cannot hurt the EPP: bounded metrics, the right status, a valid body, no hang.

Each test here is a defect a review found (issue 12, part 5); each failed on the code before its fix.
The servicer runs on a real grpc.aio server and is driven with real ProcessingRequest messages.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import generate_latest

from epp.body import BodyScanner
from epp.handlers.responses import MAX_MESSAGE_CHARS, one_line
from epp.metrics import UNKNOWN_MODEL
from harness.base.eventually import eventually_async

from .support import DEST, Env, Exchange, body, exchange, headers, immediate, mutation, serving


def strict_json(raw: bytes | None) -> Any:
    """What a strict JSON reader makes of `raw`: NaN and Infinity are not JSON."""
    assert raw is not None

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def run_exchange(env: Env, *messages: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
    async def scenario() -> list[pb.ProcessingResponse]:
        async with serving(env.servicer()) as channel:
            result = await exchange(channel, messages)
            assert result.code == grpc.StatusCode.OK, result.details
            return result.replies

    return asyncio.run(scenario())


def routed_env() -> Env:
    return Env().pool().model("food-review").pod("pod-1", "10.0.0.1")


def model_name_labels(env: Env) -> set[str]:
    return {
        sample.labels["model_name"]
        for family in env.registry.collect()
        for sample in family.samples
        if "model_name" in sample.labels
    }


# --- metrics ---------------------------------------------------------------------------------------
def test_unknown_model_names_share_one_label_value() -> None:
    """1,000 made-up names once made /metrics 2.25 MB: client input must not become label values."""
    env = routed_env()
    servicer = env.servicer()

    def ask(model: str) -> None:
        stream = servicer.new_stream()
        asyncio.run(stream.handle(headers().SerializeToString()))
        reply, end = asyncio.run(stream.handle(body({"model": model, "prompt": "hi"}).SerializeToString()))
        stream.close()
        assert end
        assert reply is not None
        assert immediate(pb.ProcessingResponse.FromString(reply))[0] == 404

    ask("made-up-0")
    size_after_one = len(generate_latest(env.registry))
    for i in range(1, 1000):
        ask(f"made-up-{i}")

    assert model_name_labels(env) == {UNKNOWN_MODEL}
    labels = {"model_name": UNKNOWN_MODEL, "target_model_name": "", "error_code": "BadConfiguration"}
    assert env.sample("inference_model_request_error_total", labels) == 1000
    assert len(generate_latest(env.registry)) - size_after_one < 100  # a few more digits, no new series


def test_a_known_model_keeps_its_own_label_value() -> None:
    env = routed_env()
    run_exchange(env, headers(), body({"model": "food-review", "prompt": "hi"}))
    assert model_name_labels(env) == {"food-review"}


# --- status codes ----------------------------------------------------------------------------------
def test_no_pool_is_503_before_any_model_lookup() -> None:
    """With no pool known nothing is routable: 503 (retry later), not 404 for a model that may exist."""
    env = Env().pod("pod-1", "10.0.0.1")
    replies = run_exchange(env, headers(), body({"model": "any-model", "prompt": "hi"}))
    status, message, _ = immediate(replies[-1])
    assert (status, message) == (503, "no InferencePool is known to the endpoint picker")
    assert DEST not in message


# --- the body the model server gets -----------------------------------------------------------------
def test_out_of_range_numbers_stay_json_when_the_model_is_rewritten() -> None:
    """`1e999` decodes to inf; re-encoding the body once wrote `Infinity`, which is not JSON."""
    env = Env().pool().model("food-review", ("food-review-lora", None)).pod("pod-1", "10.0.0.1")
    sent = b'{"model": "food-review", "prompt": "hi", "temperature": 1e999, "top_p": -1e999}'
    replies = run_exchange(env, headers(), body(sent))
    rewritten = mutation(replies[-1]).body
    assert rewritten == sent.replace(b'"food-review"', b'"food-review-lora"')
    assert strict_json(rewritten)["model"] == "food-review-lora"


def test_an_error_quoting_a_lone_surrogate_is_still_one_line_of_json() -> None:
    replies = run_exchange(routed_env(), headers(), body(b'{"model": "x\\ud800y"}'))
    status, message, _ = immediate(replies[-1])
    assert (status, message) == (404, "model x\ud800y not found")


# --- size limit ------------------------------------------------------------------------------------
def limited_env(limit: int) -> Env:
    env = routed_env()
    env.max_request_body_bytes = limit
    return env


def test_a_streamed_body_over_the_limit_is_refused_at_once() -> None:
    """Chunks used to accumulate without bound; the chunk that crosses the limit now ends the stream."""
    chunk = b" " * 400
    replies = run_exchange(
        limited_env(1000), headers(), body(chunk, eos=False), body(chunk, eos=False), body(chunk, eos=False)
    )
    assert [mutation(r).clear_body for r in replies[1:3]] == [True, True]
    status, message, _ = immediate(replies[3])
    assert (status, message) == (413, "request body larger than the endpoint picker's limit of 1000 bytes")


def test_a_buffered_body_over_the_limit_is_413() -> None:
    sent = json.dumps({"model": "food-review", "prompt": "x" * 1000}).encode()
    replies = run_exchange(limited_env(len(sent) - 1), headers(), body(sent))
    assert immediate(replies[-1])[0] == 413


def test_a_rewrite_that_grows_the_body_past_the_limit_is_413() -> None:
    """Envoy buffers with the same limit and would refuse the longer body after the EPP chose a pod."""
    env = Env().pool().model("food-review", ("food-review-lora", None)).pod("pod-1", "10.0.0.1")
    sent = json.dumps({"model": "food-review", "prompt": "x" * 1000}).encode()
    env.max_request_body_bytes = len(sent)
    status, message, _ = immediate(run_exchange(env, headers(), body(sent))[-1])
    assert status == 413
    assert message.endswith("once its model is rewritten to food-review-lora")


def test_a_body_of_exactly_the_limit_is_routed() -> None:
    sent = json.dumps({"model": "food-review", "prompt": "x" * 1000}).encode()
    replies = run_exchange(limited_env(len(sent)), headers(), body(sent))
    assert mutation(replies[-1]).metadata == {"envoy.lb": {DEST: "10.0.0.1:8000"}}


# --- when the body ends ------------------------------------------------------------------------------
TRAILERS = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def test_trailers_before_the_body_ended_get_a_readable_400() -> None:
    """A body followed by trailers (no end_of_stream on the body) was held forever."""
    sent = json.dumps({"model": "food-review", "prompt": "hi"}).encode()
    replies = run_exchange(routed_env(), headers(), body(sent, eos=False), TRAILERS)
    assert mutation(replies[1]).clear_body
    status, message, _ = immediate(replies[2])
    assert status == 400
    assert message.startswith("request trailers arrived before the request body ended")
    assert message.endswith("(send a Content-Length, or configure Envoy's request_body_mode BUFFERED)"), (
        "the message says what to change"
    )


def test_a_body_complete_by_content_length_is_routed_without_end_of_stream() -> None:
    sent = json.dumps({"model": "food-review", "prompt": "hi"}).encode()
    hdrs = {":method": "POST", ":path": "/v1/completions", "content-length": str(len(sent))}
    replies = run_exchange(
        routed_env(), headers(hdrs), body(sent[:10], eos=False), body(sent[10:], eos=False), TRAILERS
    )
    assert mutation(replies[1]).clear_body
    routed = mutation(replies[2])
    assert routed.body == sent
    assert routed.metadata == {"envoy.lb": {DEST: "10.0.0.1:8000"}}
    assert replies[3].WhichOneof("response") == "request_trailers"


def test_headers_in_the_form_before_envoy_1_31_are_read() -> None:
    """Envoy before 1.31 fills `value` and leaves `raw_value` empty: the Content-Length still counts."""
    sent = json.dumps({"model": "food-review", "prompt": "hi"}).encode()
    request = headers({":method": "POST", ":path": "/v1/completions"})
    request.request_headers.headers.headers.add(key="content-length", value=str(len(sent)))
    replies = run_exchange(routed_env(), request, body(sent[:10], eos=False), body(sent[10:], eos=False))
    assert mutation(replies[2]).body == sent, "routed once the declared length had come"


# --- big bodies, off the event loop ----------------------------------------------------------------
# A worker that starts serving only once the gate file exists: while it waits, a big body is held in
# the child, and the test can show that the event loop still serves other streams meanwhile.
GATED_WORKER = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
from epp.body.worker import serve
serve(sys.stdin.buffer, sys.stdout.buffer)
"""


def test_a_big_body_is_scanned_in_the_child_while_other_streams_are_served(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    scanner = BodyScanner(offload_bytes=64 * 1024, command=[sys.executable, "-c", GATED_WORKER, str(gate)])
    env = Env(body_scanner=scanner).pool().model("food-review", ("food-review-lora", None))
    env.pod("pod-1", "10.0.0.1")
    big = json.dumps({"prompt": "é" * 100_000, "model": "food-review"}, ensure_ascii=False).encode()
    small = json.dumps({"model": "food-review", "prompt": "hi"}).encode()

    async def scenario() -> tuple[Exchange, Exchange]:
        try:
            async with serving(env.servicer()) as channel:
                big_stream = asyncio.create_task(exchange(channel, [headers(), body(big)]))

                async def child_started() -> None:
                    assert scanner.child_pid is not None, "the big body has not reached the child yet"

                await eventually_async(child_started)
                small_result = await exchange(channel, [headers(), body(small)])
                assert not big_stream.done(), "the big body finished while its scanner was still gated"
                gate.touch()
                return small_result, await big_stream
        finally:
            await scanner.aclose()

    small_result, big_result = asyncio.run(scenario())
    for result, sent in ((small_result, small), (big_result, big)):
        assert result.code == grpc.StatusCode.OK, result.details
        assert mutation(result.replies[-1]).body == sent.replace(b'"food-review"', b'"food-review-lora"')
    assert scanner.child_pid is None


def test_a_body_after_a_bodyless_decision_gets_no_second_destination() -> None:
    """Found by the fuzzer: headers with end_of_stream were routed, then a body was routed again."""
    sent = json.dumps({"model": "food-review", "prompt": "hi"}).encode()
    replies = run_exchange(routed_env(), headers(eos=True), body(sent))
    assert mutation(replies[0]).metadata == {"envoy.lb": {DEST: "10.0.0.1:8000"}}
    second = mutation(replies[1])
    assert (second.set_headers, second.metadata, second.body) == (frozenset(), {}, None)


def test_headers_after_a_routed_body_get_no_second_destination() -> None:
    """Found by the long fuzz run: a body routed, then request headers with end_of_stream routed again."""
    sent = json.dumps({"model": "food-review", "prompt": "hi"}).encode()
    replies = run_exchange(routed_env(), body(sent), headers(eos=True))
    assert mutation(replies[0]).metadata == {"envoy.lb": {DEST: "10.0.0.1:8000"}}
    second = mutation(replies[1])
    assert (second.set_headers, second.metadata) == (frozenset(), {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("a" * MAX_MESSAGE_CHARS, "a" * MAX_MESSAGE_CHARS, id="at-the-limit-kept"),
        pytest.param(
            "a" * (MAX_MESSAGE_CHARS + 1), "a" * (MAX_MESSAGE_CHARS - 3) + "...", id="over-cut-to-the-limit"
        ),
        pytest.param(" two\n  lines\t", "two lines", id="whitespace-collapsed"),
    ],
)
def test_a_message_is_one_line_of_at_most_the_limit(text: str, expected: str) -> None:
    assert one_line(text) == expected
    assert len(one_line(text)) <= MAX_MESSAGE_CHARS


def test_the_servicer_closes_the_scanner_it_made_and_leaves_one_passed_in_to_its_owner() -> None:
    """`aclose` stops only a scanner the servicer made: one passed in may still serve others."""
    theirs = BodyScanner(offload_bytes=1)  # every body goes to the child
    lent = Env(body_scanner=theirs)
    own = Env().pool().model("food-review").pod("pod-1", "10.0.0.1")
    big = json.dumps({"model": "food-review", "prompt": "x" * 300_000}).encode()  # over the own offload size

    async def scenario() -> Exchange:
        try:
            await lent.servicer().aclose()
            assert (await theirs.scan(b'{"model": "m"}')).model == "m", "a scanner passed in stays open"
        finally:
            await theirs.aclose()
        await own.servicer().aclose()
        async with serving(own.servicer()) as channel:
            return await exchange(channel, [headers(), body(big)])

    result = asyncio.run(scenario())
    assert immediate(result.replies[-1])[:2] == (500, "the endpoint picker is shutting down")
