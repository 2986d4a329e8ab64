"""The simulator's newer mechanics over HTTP: one metric-name set per vLLM version, preemptions and
prefix-cache counters on /metrics, tokenizer endpoints for routers, and the cold-start reset.
Also: the EPP's own metrics parser reads the KV gauge of either version from a real page.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from epp.backend.metrics.parse import parse
from epp.config import MetricNames
from epp.datastore.types import Metrics
from harness.sim import ModelServerSim, SimConfig
from harness.sim._config import NEW_NAMES, OLD_NAMES, OLD_VLLM_VERSION

from .scrape import families

pytestmark = pytest.mark.anyio

FAST = SimConfig(model="base", lora_adapters=("a",), max_loras=1, time_scale=0.001)
OLD = SimConfig(model="base", time_scale=0.001, vllm_version=OLD_VLLM_VERSION)


async def metrics_page(http: aiohttp.ClientSession, sim: ModelServerSim) -> str:
    async with http.get(f"{sim.base_url}/metrics") as response:
        return await response.text()


async def complete(http: aiohttp.ClientSession, sim: ModelServerSim, **body: Any) -> dict[str, Any]:
    payload = {"model": "base", "prompt": "hello", "max_tokens": 2, **body}
    async with http.post(f"{sim.base_url}/v1/completions", json=payload) as response:
        assert response.status == 200
        result: dict[str, Any] = await response.json()
        return result


def counter(text: str, name: str) -> float:
    (sample,) = [s for s in families(text)[name].samples if s.name.endswith("_total")]
    return sample.value


@pytest.mark.parametrize(
    ("config", "present", "absent"),
    [
        pytest.param(FAST, NEW_NAMES, OLD_NAMES, id="0.11-kv_cache_usage_perc"),
        pytest.param(OLD, OLD_NAMES, NEW_NAMES, id="0.9-gpu_cache_usage_perc"),
    ],
)
async def test_each_vllm_version_publishes_exactly_one_metric_name_set(
    address: str, config: SimConfig, present: Any, absent: Any
) -> None:
    async with ModelServerSim(address, config=config) as sim, aiohttp.ClientSession() as http:
        await complete(http, sim)
        fams = families(await metrics_page(http, sim))
    for name in (present.kv_cache_usage, present.prefix_cache_queries, present.prefix_cache_hits):
        assert name in fams, name
    for name in (absent.kv_cache_usage, absent.prefix_cache_queries, absent.prefix_cache_hits):
        assert name not in fams, name


@pytest.mark.parametrize("config", [FAST, OLD], ids=["new-names", "old-names"])
async def test_the_epp_parser_reads_the_kv_gauge_of_either_version(address: str, config: SimConfig) -> None:
    async with ModelServerSim(address, config=config) as sim:
        sim.set_gauges(kv_cache=0.37)
        page = sim.metrics_text()
    metrics, errors = parse(page, MetricNames(), Metrics(), now=1.0)
    assert metrics.kv_cache_usage == pytest.approx(0.37)
    assert not [e for e in errors if "cache_usage" in e]


async def test_preemptions_are_counted_on_the_metrics_page(address: str) -> None:
    # Two requests that each grow to 4 blocks in a 4-block cache: the newer one is preempted.
    config = SimConfig(model="base", num_gpu_blocks=4, block_size=16, time_scale=0.001)
    async with ModelServerSim(address, config=config) as sim, aiohttp.ClientSession() as http:
        prompt = "p" * 64  # 16 tokens
        results = await asyncio.gather(*(complete(http, sim, prompt=prompt, max_tokens=40) for _ in range(2)))
        page = await metrics_page(http, sim)
    assert [r["usage"]["completion_tokens"] for r in results] == [40, 40]
    assert counter(page, "vllm:num_preemptions") >= 1


async def test_a_repeated_prompt_hits_the_prefix_cache(address: str) -> None:
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        prompt = "a long shared system prompt. " * 20  # 580 characters = 145 tokens = 9 full blocks
        await complete(http, sim, prompt=prompt)
        first = await metrics_page(http, sim)
        await complete(http, sim, prompt=prompt)
        second = await metrics_page(http, sim)
        await complete(http, sim, model="a", prompt=prompt)  # another adapter: its own cache keys
        third = await metrics_page(http, sim)
    assert counter(first, "vllm:prefix_cache_hits") == 0
    assert counter(second, "vllm:prefix_cache_hits") == 9 * 16
    assert counter(third, "vllm:prefix_cache_hits") == 9 * 16
    assert counter(third, "vllm:prefix_cache_queries") == 3 * 145


async def test_reset_forgets_cached_prefixes_and_counts(address: str) -> None:
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        prompt = "x" * 640
        await complete(http, sim, model="a", prompt=prompt)
        sim.reset()
        assert sim.requests_by_model == {}
        assert sim.state().loaded_loras == ()
        await complete(http, sim, model="a", prompt=prompt)
        page = await metrics_page(http, sim)
    assert counter(page, "vllm:prefix_cache_hits") == 0


async def test_tokenize_and_render_give_prefix_stable_token_ids(address: str) -> None:
    async with ModelServerSim(address, config=FAST) as sim, aiohttp.ClientSession() as http:
        async with http.post(f"{sim.base_url}/tokenize", json={"model": "base", "prompt": "abcdefgh"}) as r:
            assert r.status == 200
            tokenized = await r.json()
        body = {"model": "base", "prompt": "abcdefghijkl"}
        async with http.post(f"{sim.base_url}/v1/completions/render", json=body) as r:
            assert r.status == 200
            rendered = await r.json()
        async with http.post(f"{sim.base_url}/tokenize", data=json.dumps({"prompt": 3})) as r:
            assert r.status == 400
    assert tokenized["count"] == 2
    assert rendered[0]["token_ids"][:2] == tokenized["tokens"]
    assert len(rendered[0]["token_ids"]) == 3


def test_the_fast_state_exposition_matches_prometheus_client() -> None:
    from prometheus_client import generate_latest

    from harness.sim._engine import Engine
    from harness.sim._metrics import SimMetrics

    config = SimConfig(model='odd "model" \\ name', lora_adapters=("a",), max_loras=1)
    metrics = SimMetrics(config, Engine(config))
    metrics.pin(lambda old: old)  # no pins: the real (idle) state
    reference = generate_latest(metrics.live_registry)
    assert metrics.render().startswith(reference)
