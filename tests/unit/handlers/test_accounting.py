"""The handlers' routing memory: a routed request counts in flight on its pod until its ext_proc
stream ends (Envoy ends it when the HTTP exchange is over), and its prompt prefix is remembered."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.api.types import NamespacedName
from epp.datastore import PodMetrics
from epp.handlers.accounting import Accounting, prompt_token_estimate
from epp.handlers.served import SERVED_KEY, SERVED_NAMESPACE
from epp.scheduling.prefix import block_hashes
from harness.base.eventually import eventually_async

from .support import NS, Env, body, exchange, headers, serving

LONG_PROMPT = "You are a helpful assistant. " * 10  # 290 characters: 4 full 64-character blocks
COMPLETION = {"model": "food-review", "prompt": LONG_PROMPT, "max_tokens": 8}
NO_BODY = processing_mode_pb2.ProcessingMode.NONE
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


def env(**options: bool) -> Env:
    return (
        Env(accounting=True, **options)
        .pool()
        .model("food-review", ("food-review-lora", None))
        .pod("pod-1", "10.0.0.1")
        .pod("pod-2", "10.0.0.2")
    )


async def routed(channel: grpc.aio.Channel, response_body: int = NO_BODY) -> Any:
    """An ext_proc stream whose request (headers, then the completion's body) has been routed; the
    headers carry Envoy's protocol_config with this response body mode."""
    call = pb_grpc.ExternalProcessorStub(channel).Process()
    first = headers()
    first.protocol_config.response_body_mode = response_body
    await call.write(first)
    await call.read()
    await call.write(body(COMPLETION))
    await call.read()
    return call


def pod(e: Env, name: str) -> PodMetrics:
    return next(p for p in e.datastore.pod_get_all() if p.pod.key.name == name)


async def released(e: Env, name: str) -> None:
    """Until the pod counts nothing in flight: no request, no prompt token, no prefill."""

    async def ended() -> None:
        flight = pod(e, name).dispatched
        assert (flight.count, flight.prompt_tokens, flight.prefill_tokens) == (0, 0, 0)

    await eventually_async(ended)


def test_a_routed_request_is_in_flight_until_its_stream_ends() -> None:
    e = env()
    e.scheduler.pick = "pod-2"

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            call = await routed(channel)  # the response is now streaming through Envoy
            assert pod(e, "pod-2").dispatched.count == 1
            assert pod(e, "pod-2").dispatched.models == {"food-review-lora"}
            assert pod(e, "pod-1").dispatched.count == 0
            await call.done_writing()  # Envoy half-closes when the HTTP exchange is over

            async def ended() -> None:
                assert pod(e, "pod-2").dispatched.count == 0

            await eventually_async(ended)
            assert await call.code() == grpc.StatusCode.OK

    asyncio.run(scenario())


def test_a_routed_prompt_counts_as_prefilling_until_the_first_response_chunk() -> None:
    """The EPP sees the response body (v1's FULL_DUPLEX_STREAMED): its first chunk means the engine
    has prefilled the prompt; the prompt's tokens (estimated from the body's size) stay in flight
    as context until the stream ends."""
    e = env()
    e.scheduler.pick = "pod-1"
    estimate = len(body(COMPLETION).request_body.body) // 4

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            call = await routed(channel, FULL_DUPLEX)
            assert (e.scheduler.requests[0].prompt_tokens, estimate > 70) == (estimate, True)
            flight = pod(e, "pod-1").dispatched
            assert (flight.prompt_tokens, flight.prefill_tokens, flight.prefilled_at) == (
                estimate,
                estimate,
                None,
            )
            await call.write(body(b'data: {"choices": []}\n\n', eos=False, response=True))
            await call.read()
            flight = pod(e, "pod-1").dispatched
            assert (flight.prompt_tokens, flight.prefill_tokens) == (estimate, 0)
            assert flight.prefilled_at is not None
            await call.write(body(b"data: [DONE]\n\n", response=True))
            await call.read()
            await call.done_writing()
            await released(e, "pod-1")

    asyncio.run(scenario())


@pytest.mark.parametrize("protocol_config", [True, False], ids=["response-body-none", "not-said"])
def test_without_the_response_body_a_prompt_counts_as_context_only(protocol_config: bool) -> None:
    """No first chunk will come (response body NONE, or Envoy did not say): a prefill counted until
    the stream ends would make the pod look busy through the whole decode, so none is counted."""
    e = env()
    e.scheduler.pick = "pod-1"

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            if protocol_config:
                call = await routed(channel, NO_BODY)
            else:
                call = pb_grpc.ExternalProcessorStub(channel).Process()
                await call.write(headers())
                await call.read()
                await call.write(body(COMPLETION))
                await call.read()
            flight = pod(e, "pod-1").dispatched
            assert (flight.count, flight.prompt_tokens > 70, flight.prefill_tokens) == (1, True, 0)
            await call.done_writing()
            await released(e, "pod-1")

    asyncio.run(scenario())


def test_a_cancelled_stream_stops_counting_too() -> None:
    e = env()

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            call = await routed(channel)
            assert sum(p.dispatched.count for p in e.datastore.pod_get_all()) == 1
            call.cancel()  # the client went away: Envoy resets the stream

            async def released() -> None:
                assert sum(p.dispatched.count for p in e.datastore.pod_get_all()) == 0

            await eventually_async(released)

    asyncio.run(scenario())


def test_a_rejected_request_never_counts() -> None:
    e = env()

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            result = await exchange(channel, [headers(), body({"model": "unknown", "prompt": "x"})])
            assert result.code == grpc.StatusCode.OK
            assert result.replies[-1].HasField("immediate_response")  # 404 from the EPP

    asyncio.run(scenario())
    assert [p.dispatched.count for p in e.datastore.pod_get_all()] == [0, 0]


def test_a_prefix_aware_epp_remembers_where_a_prompt_went_and_tells_the_scheduler() -> None:
    e = env(prefix_aware=True)
    e.scheduler.pick = "pod-1"

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            for _ in range(2):
                result = await exchange(channel, [headers(), body(COMPLETION)])
                assert result.code == grpc.StatusCode.OK

    asyncio.run(scenario())
    first, second = e.scheduler.requests
    assert (first.prefix_blocks, dict(first.prefix_matches)) == (4, {})
    assert second.prefix_blocks == 4
    assert dict(second.prefix_matches) == {pod(e, "pod-1").pod.key: 4}
    assert e.datastore.prefix_matches(block_hashes(LONG_PROMPT, "food-review-lora")) == {
        pod(e, "pod-1").pod.key: 4
    }


def holders(e: Env) -> set[str]:
    """The pods the prefix index says hold LONG_PROMPT's blocks."""
    found = e.datastore.prefix_matches(block_hashes(LONG_PROMPT, "food-review-lora"))
    return {key.name for key, blocks in found.items() if blocks}


@pytest.mark.parametrize("fallback_served", [False, True], ids=["the-pick", "a-fallback"])
def test_where_the_first_byte_is_reported_a_prefix_is_cached_from_it_on(fallback_served: bool) -> None:
    """vLLM reuses only computed blocks: until the first response chunk the prompt is being
    prefilled and a follow-up sent to the same pod would find nothing cached, so the index learns
    the prefix then, on the pod that served (a pick a fallback replaced never holds it)."""
    e = env(prefix_aware=True)
    e.fallbacks = 1
    e.scheduler.pick = "pod-1"

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            call = await routed(channel, FULL_DUPLEX)
            if fallback_served:
                await call.write(served_report("10.0.0.2:8000"))
                await call.read()
            assert holders(e) == set()
            await call.write(body(b'data: {"choices": []}\n\n', eos=False, response=True))
            await call.read()
            assert holders(e) == {"pod-2" if fallback_served else "pod-1"}
            await call.write(body(b"data: [DONE]\n\n", response=True))
            await call.read()
            await call.done_writing()
            await released(e, "pod-2" if fallback_served else "pod-1")

    asyncio.run(scenario())


def test_prompts_are_hashed_with_the_configured_block_size_and_limit() -> None:
    """The scheduler's block size and block limit (the prefix scorer's settings) reach the hashing:
    16-character blocks, at most 5, where the defaults would give 4 blocks of 64."""
    accounting = Accounting(env().datastore, prefix_aware=True, block_chars=16, max_blocks=5)
    query = accounting.prefix_query(LONG_PROMPT, "food-review-lora")
    assert query.hashes == block_hashes(LONG_PROMPT, "food-review-lora", block_chars=16, max_blocks=5)
    assert len(query.hashes) == 5


def test_without_prefix_awareness_no_prompt_is_hashed() -> None:
    e = env()

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            await exchange(channel, [headers(), body(COMPLETION)])

    asyncio.run(scenario())
    (request,) = e.scheduler.requests
    assert (request.prefix_blocks, dict(request.prefix_matches)) == (0, {})


def served_report(endpoint: str | None) -> pb.ProcessingRequest:
    """Response headers as a list-aware proxy sends them: the endpoint that served, in metadata (None:
    metadata from another filter only, as a proxy that is not list-aware sends)."""
    report = headers({":status": "200", "content-type": "application/json"}, response=True)
    if endpoint is None:
        report.metadata_context.filter_metadata["envoy.filters.http.other"].update({"other": "value"})
    else:
        report.metadata_context.filter_metadata[SERVED_NAMESPACE].update({SERVED_KEY: endpoint})
    return report


@pytest.mark.parametrize(
    ("served", "counted"),
    [
        pytest.param("10.0.0.2:8000", {"pod-1": 0, "pod-2": 1}, id="a-fallback-served"),
        pytest.param("10.0.0.1:8000", {"pod-1": 1, "pod-2": 0}, id="the-pick-served"),
        pytest.param("10.9.9.9:8000", {"pod-1": 1, "pod-2": 0}, id="not-among-those-sent"),
        pytest.param(None, {"pod-1": 1, "pod-2": 0}, id="not-reported"),
    ],
)
def test_the_endpoint_that_served_holds_the_request_and_its_prefix(
    served: str | None, counted: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    """The proxy walked the list: the fallback that served counts the request in flight and holds its
    prompt's prefix, as the pick would have; an endpoint the EPP never sent is not believed, and
    neither that nor a report without it is an error (the unknown one is noted at debug)."""
    caplog.set_level(logging.DEBUG, logger="epp.handlers")
    e = env(prefix_aware=True)
    e.fallbacks = 1
    e.scheduler.pick = "pod-1"

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            call = await routed(channel)
            assert {n: pod(e, n).dispatched.count for n in counted} == {"pod-1": 1, "pod-2": 0}
            await call.write(served_report(served))
            await call.read()
            assert {n: pod(e, n).dispatched.count for n in counted} == counted
            # The one holding the request holds its target model too (the LoRA scorer reads it).
            assert {n: pod(e, n).dispatched.models for n in counted} == {
                n: frozenset({"food-review-lora"}) if c else frozenset() for n, c in counted.items()
            }
            holder = e.datastore.prefix_matches(block_hashes(LONG_PROMPT, "food-review-lora"))
            holders = {key.name for key, blocks in holder.items() if blocks}
            assert holders == {n for n, c in counted.items() if c} | {"pod-1"}
            await call.done_writing()

            async def ended() -> None:
                assert {n: pod(e, n).dispatched.count for n in counted} == {"pod-1": 0, "pod-2": 0}

            await eventually_async(ended)

    asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    noted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("served by")]
    unknown = served == "10.9.9.9:8000"
    assert noted == (
        [f"served by {served}, which is not among the endpoints sent: ignored"] if unknown else []
    )


def test_a_fallback_that_served_a_pick_gone_before_it_was_counted_carries_the_prompt() -> None:
    """The pick left between the candidates' snapshot and its count, so nothing was counted for it;
    the fallback that served counts the request with its prompt's size, as the pick would have."""
    e = env()
    e.fallbacks = 1
    e.scheduler.pick = "pod-1"
    e.scheduler.meanwhile = lambda: e.datastore.pod_delete(NamespacedName(NS, "pod-1"))

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            call = await routed(channel)
            assert pod(e, "pod-2").dispatched.count == 0
            await call.write(served_report("10.0.0.2:8000"))
            await call.read()
            flight = pod(e, "pod-2").dispatched
            sent = len(json.dumps(COMPLETION).encode())  # the body `routed` sent, as `body` encodes it
            assert (flight.count, flight.prompt_tokens) == (1, prompt_token_estimate(sent))
            await call.done_writing()
            await released(e, "pod-2")

    asyncio.run(scenario())


def test_a_request_never_routed_and_a_lone_pick_report_release_nothing_wrongly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refused request holds nothing to release; with no fallbacks sent, a served report changes
    nothing. Neither is an error."""
    e = env()
    caplog.set_level(logging.WARNING)

    async def scenario() -> None:
        async with serving(e.servicer()) as channel:
            refused = await exchange(channel, [headers(), body({"model": "no-such-model", "prompt": "x"})])
            assert refused.code == grpc.StatusCode.OK, refused.details
            call = await routed(channel)
            await call.write(served_report("10.0.0.2:8000"))
            await call.read()
            assert {n: pod(e, n).dispatched.count for n in ("pod-1", "pod-2")} == {"pod-1": 1, "pod-2": 0}
            await call.done_writing()

    asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records] == []
