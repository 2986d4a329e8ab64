"""The simulator over HTTP: OpenAI shapes, SSE, errors, /metrics from real state, test overrides."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from typing import Any

import aiohttp
import pytest

from harness.base.eventually import eventually_async
from harness.sim import SERVED_BY_HEADER, ModelServerSim, SimConfig, SimThread

from .scrape import families, gauges, scrape

pytestmark = pytest.mark.anyio

FAST = SimConfig(model="base", lora_adapters=("a", "b"), time_scale=0.001)
# Requests that never finish by themselves (a million tokens at ~10 ms a step): tests end them by
# disconnecting.
STUCK = {"step_base_s": 0.01, "time_scale": 1.0}
STUCK_TOKENS = 1_000_000

REQUIRED_FAMILIES = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:lora_requests_info",
    "vllm:cache_config_info",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:prompt_tokens",  # the parser names counter families without _total
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:request_success",
)


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as response:
        return response.status, await response.json()


def completion(model: str, prompt: str = "hello world", **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": 4, **extra}


async def test_metrics_page_has_the_vllm_families_and_parses(address: str) -> None:
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        status, _ = await post(http, f"{sim.base_url}/v1/completions", completion("base"))
        assert status == 200
        async with http.get(f"{sim.base_url}/metrics") as response:
            text = await response.text()
            assert response.headers["Content-Type"].startswith("text/plain")

    fams = families(text)
    missing = [name for name in REQUIRED_FAMILIES if name not in fams]
    assert not missing
    ttft = fams["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    count = next(s for s in ttft.samples if s.name.endswith("_count"))
    assert count.labels == {"model_name": "base", "engine": "0"}
    assert count.value == 1
    buckets = [s.labels["le"] for s in ttft.samples if s.name.endswith("_bucket")]
    assert buckets[:3] == ["0.001", "0.005", "0.01"]
    assert buckets[-1] == "+Inf"
    (cache_info,) = fams["vllm:cache_config_info"].samples
    assert cache_info.labels["block_size"] == "16"
    assert cache_info.labels["num_gpu_blocks"] == "1024"
    lora_info = fams["vllm:lora_requests_info"].samples
    assert {"max_lora", "running_lora_adapters", "waiting_lora_adapters"} == set(lora_info[0].labels)
    assert all(s.value > 1.5e9 for s in lora_info)  # last-update unix times


def test_metrics_page_is_as_large_as_a_real_vllm_page(address: str) -> None:
    with (
        SimThread(ModelServerSim(address, config=FAST)) as handle,
        urllib.request.urlopen(f"{handle.sim.base_url}/metrics") as response,
    ):
        page = response.read()
    assert len(page) >= 20_000


async def test_requests_beyond_max_num_seqs_wait_in_the_queue(address: str) -> None:
    config = SimConfig(model="base", max_num_seqs=2, **STUCK)  # type: ignore[arg-type]
    async with ModelServerSim(address, config=config) as sim, aiohttp.ClientSession() as http:
        url = f"{sim.base_url}/v1/completions"
        async with asyncio.TaskGroup() as group:
            body = completion("base", max_tokens=STUCK_TOKENS)
            clients = [group.create_task(post(http, url, body)) for _ in range(5)]

            async def queued() -> None:
                g = await scrape(http, sim.base_url)
                assert (g.running, g.waiting) == (2, 3)
                assert g.kv_cache > 0

            await eventually_async(queued)
            for client in clients:  # a client that disconnects aborts its request, as in vLLM
                client.cancel()

        async def drained() -> None:
            g = await scrape(http, sim.base_url)
            assert (g.running, g.waiting, g.kv_cache) == (0, 0, 0)

        await eventually_async(drained)
        assert sim.requests_by_model == {"base": 5}


async def test_lora_request_waits_for_the_only_slot_then_evicts(address: str) -> None:
    # max_loras=1; a request for a million tokens holds the adapter slot until it is cancelled.
    config = SimConfig(model="base", lora_adapters=("a", "b"), max_loras=1, max_num_seqs=4, time_scale=0.01)
    async with ModelServerSim(address, config=config) as sim, aiohttp.ClientSession() as http:
        url = f"{sim.base_url}/v1/completions"
        async with asyncio.TaskGroup() as group:
            long_a = group.create_task(post(http, url, completion("a", max_tokens=STUCK_TOKENS)))

            async def a_running() -> None:
                g = await scrape(http, sim.base_url)
                assert (g.running, g.running_loras, g.max_lora) == (1, "a", "1")

            await eventually_async(a_running)
            short_b = group.create_task(post(http, url, completion("b", prompt="y", max_tokens=1)))

            async def b_waiting() -> None:
                g = await scrape(http, sim.base_url)
                assert (g.running, g.waiting) == (1, 1)  # free running slots, but no LoRA slot
                assert (g.running_loras, g.waiting_loras) == ("a", "b")

            await eventually_async(b_waiting)
            assert not short_b.done()
            long_a.cancel()
        status, body = short_b.result()
        assert status == 200
        assert body["model"] == "b"
        assert sim.state().loaded_loras == ("b",)  # a was evicted to load b
        assert sim.requests_by_model == {"a": 1, "b": 1}


@pytest.mark.parametrize("kind", ["completions", "chat"])
async def test_sse_stream_ends_with_a_usage_chunk_and_done(address: str, kind: str) -> None:
    if kind == "chat":
        path = "/v1/chat/completions"
        body: dict[str, Any] = {"model": "a", "messages": [{"role": "user", "content": "hello there"}]}
    else:
        path, body = "/v1/completions", {"model": "a", "prompt": "hello there"}
    body |= {"max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    async with (
        ModelServerSim(address, config=FAST) as sim,
        aiohttp.ClientSession() as http,
        http.post(f"{sim.base_url}{path}", json=body) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = (await response.read()).decode()

    events = [event for event in raw.split("\n\n") if event]
    assert all(event.startswith("data: ") for event in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    *content, usage_chunk = chunks
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    if kind == "chat":
        assert content[0]["choices"][0]["delta"]["role"] == "assistant"
        content = content[1:]
        texts = [c["choices"][0]["delta"]["content"] for c in content]
    else:
        texts = [c["choices"][0]["text"] for c in content]
    assert len(texts) == 5
    assert all(texts)
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 4 + ["length"]
    assert len({c["id"] for c in chunks}) == 1


async def test_stream_without_include_usage_has_no_usage_chunk(address: str) -> None:
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        body = completion("base", stream=True)
        async with http.post(f"{sim.base_url}/v1/completions", json=body) as response:
            raw = (await response.read()).decode()
    events = [event for event in raw.split("\n\n") if event]
    assert events[-1] == "data: [DONE]"
    assert all("usage" not in json.loads(e.removeprefix("data: ")) for e in events[:-1])


@pytest.mark.parametrize(
    ("body", "status", "err_type", "message"),
    [
        pytest.param(
            completion("nope"), 404, "NotFoundError", "The model `nope` does not exist.", id="unknown-model"
        ),
        pytest.param(completion(""), 404, "NotFoundError", "The model `` does not exist.", id="empty-model"),
        pytest.param(b'{"model": "base", "prompt": ', 400, "BadRequestError", None, id="malformed-json"),
        pytest.param(b"\xff\xfe", 400, "BadRequestError", None, id="not-utf8"),
        pytest.param([1, 2], 400, "BadRequestError", None, id="not-an-object"),
        pytest.param({"model": "base"}, 400, "BadRequestError", None, id="no-prompt"),
        pytest.param(completion("base", max_tokens=0), 400, "BadRequestError", None, id="zero-max-tokens"),
        pytest.param(
            completion("base", stream_options={"include_usage": True}),
            400,
            "BadRequestError",
            None,
            id="stream-options-without-stream",
        ),
    ],
)
async def test_invalid_requests_get_openai_errors(
    address: str, body: Any, status: int, err_type: str, message: str | None
) -> None:
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        got_status, got = await post(http, f"{sim.base_url}/v1/completions", body)
        assert sim.requests_by_model == {}
    assert got_status == status
    assert got["error"]["type"] == err_type
    assert got["error"]["code"] == status
    if message is not None:
        assert got["error"]["message"] == message


async def test_too_long_request_is_rejected_when_max_model_len_is_set(address: str) -> None:
    config = SimConfig(model="base", max_model_len=100, time_scale=0.001)
    async with ModelServerSim(address, config=config) as sim, aiohttp.ClientSession() as http:
        status, body = await post(http, f"{sim.base_url}/v1/completions", completion("base", "x" * 400))
    assert status == 400
    assert "maximum context length is 100 tokens" in body["error"]["message"]


async def test_every_response_says_which_server_served_it(address: str) -> None:
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        for method, path, body in [
            ("POST", "/v1/completions", completion("base")),
            ("POST", "/v1/completions", completion("nope")),
            ("GET", "/metrics", None),
            ("GET", "/v1/models", None),
        ]:
            async with http.request(method, f"{sim.base_url}{path}", json=body) as response:
                assert response.headers[SERVED_BY_HEADER] == f"{address}:8000"


async def test_models_lists_base_and_adapters_and_follows_load_unload(address: str) -> None:
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:

        async def model_ids() -> list[str]:
            async with http.get(f"{sim.base_url}/v1/models") as response:
                listing = await response.json()
            assert listing["object"] == "list"
            return [m["id"] for m in listing["data"]]

        assert await model_ids() == ["base", "a", "b"]
        async with http.post(f"{sim.base_url}/v1/load_lora_adapter", json={"lora_name": "c"}) as response:
            assert response.status == 200
        async with http.post(f"{sim.base_url}/v1/unload_lora_adapter", json={"lora_name": "a"}) as response:
            assert response.status == 200
        assert await model_ids() == ["base", "b", "c"]
        status, _ = await post(http, f"{sim.base_url}/v1/completions", completion("a"))
        assert status == 404
        status, _ = await post(http, f"{sim.base_url}/v1/completions", completion("c"))
        assert status == 200


async def test_set_gauges_pins_reported_values_until_cleared(address: str) -> None:
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        sim.set_gauges(waiting=7, kv_cache=0.5)
        sim.set_gauges(running=3, running_loras=["a", "b"], waiting_loras=["c"])  # earlier pins stay
        g = await scrape(http, sim.base_url)
        assert (g.waiting, g.running, g.kv_cache) == (7, 3, 0.5)
        assert (g.running_loras, g.waiting_loras, g.max_lora) == ("a,b", "c", "1")
        async with http.get(f"{sim.base_url}/metrics") as response:
            lora_series = families(await response.text())["vllm:lora_requests_info"].samples
        assert len(lora_series) == 1  # a pinned LoRA state replaces the history

        sim.clear_overrides()
        g = await scrape(http, sim.base_url)
        assert (g.waiting, g.running, g.kv_cache, g.running_loras, g.waiting_loras) == (0, 0, 0, "", "")


def test_thread_handle_serves_from_sync_code_and_leaves_no_thread(addresses: Any) -> None:
    sims = [ModelServerSim(addresses.acquire(), config=FAST) for _ in range(2)]
    handle = SimThread(sims[0]).start()
    other = SimThread(sims[1]).start()
    try:
        for sim in sims:
            sim.set_gauges(waiting=2)  # from this thread while the sim serves from its own
            with urllib.request.urlopen(f"{sim.base_url}/metrics") as response:
                assert gauges(response.read().decode()).waiting == 2
            assert sim.state().running == 0
            assert gauges(sim.metrics_text()).waiting == 2
    finally:
        handle.stop()
        other.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("sim-")]


def test_thread_start_reports_a_bind_failure(address: str) -> None:
    with SimThread(ModelServerSim(address, config=FAST)):
        second = ModelServerSim(address, config=FAST)
        with pytest.raises(RuntimeError, match="failed to start") as info:
            SimThread(second).start()
        assert isinstance(info.value.__cause__, OSError)
    assert not [t for t in threading.enumerate() if t.name.startswith("sim-")]


async def test_received_requests_keep_headers_repeats_and_the_raw_body(address: str) -> None:
    raw = b'{"model": "base",  "prompt": "hi", "max_tokens": 1}'
    headers = [("Content-Type", "application/json"), ("X-Twice", "one"), ("X-Twice", "two")]
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        async with http.post(f"{sim.base_url}/v1/completions", data=raw, headers=headers) as response:
            assert response.status == 200
        async with http.get(f"{sim.base_url}/metrics") as response:
            assert response.status == 200
        [received] = sim.received_requests()  # generation requests only, not scrapes
    assert (received.method, received.path, received.body) == ("POST", "/v1/completions", raw)
    assert received.header_values("x-twice") == ["one", "two"]
    assert received.header_values("Content-Length") == [str(len(raw))]


async def test_scrapes_count_every_metrics_page_served(address: str) -> None:
    """What the routing bench waits on after resuming a paused EPP without a datastore view."""
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        assert sim.scrapes == 0
        for _ in range(3):
            await scrape(http, sim.base_url)
        async with http.get(f"{sim.base_url}/health") as response:
            assert response.status == 200
        assert sim.scrapes == 3, "only /metrics pages count"
