"""Our ext_proc handlers behind a real Envoy in v1 mode (`EnvoyOptions.v1`), no control plane.

The servicer runs on `epp.h2` over plaintext with a datastore seeded directly (as the handler tests
do); two simulators are the pool's pods. In full duplex Envoy forwards only what the EPP hands back,
so a whole response proves every chunk was echoed; the token counters prove the usage was still read.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from epp.h2 import GrpcServer
from harness.base.addresses import AddressPool
from harness.dataplane.envoy import Envoy, EnvoyOptions
from harness.sim import SERVED_BY_HEADER, ModelServerSim, SimConfig
from tests.unit.handlers.support import Env

pytestmark = pytest.mark.anyio

SIM = SimConfig(model="base", time_scale=0.001)
SUBSET_HEADER = "x-test-subset"
LABELS = {"model_name": "base", "target_model_name": "base"}


@pytest.fixture
def pool() -> Iterator[AddressPool]:
    with AddressPool() as addresses:
        yield addresses


@contextlib.asynccontextmanager
async def v1_gateway(
    pool: AddressPool, *, fallbacks: int = 0, list_aware: bool = False
) -> AsyncIterator[tuple[Env, Envoy, list[str]]]:
    """Two pods, our handlers, an Envoy in v1 mode with the subset test header; yields the pods'
    addresses. `list_aware`: a third pod, `pod-dead`, whose address nothing listens on, and Envoy's
    override_host cluster of all three, from its EDS file (ORIGINAL_DST otherwise)."""
    async with (
        ModelServerSim(pool.acquire(), config=SIM) as first,
        ModelServerSim(pool.acquire(), config=SIM) as second,
    ):
        port_text = first.address.rsplit(":", 1)[1]
        env = Env(fallbacks=fallbacks).pool(port=int(port_text)).model("base")
        env.pod("pod-1", first.address.rsplit(":", 1)[0]).pod("pod-2", second.address.rsplit(":", 1)[0])
        endpoints: tuple[str, ...] = ()
        if list_aware:
            dead = pool.acquire()
            env.pod("pod-dead", dead)
            endpoints = (first.address, second.address, f"{dead}:{port_text}")
        server = GrpcServer()
        env.servicer().add_to_h2_server(server)
        port = await server.start("127.0.0.1", 0)
        try:
            options = EnvoyOptions.v1(
                ext_proc_tls=False,
                subset_hint_header=SUBSET_HEADER,
                model_server_endpoints=endpoints,
                follow_pool_endpoints=list_aware,
            )
            with Envoy(f"127.0.0.1:{port}", options=options) as envoy:
                yield env, envoy, [first.address, second.address]
        finally:
            await server.stop(None)
            await env.servicer().aclose()


def tokens(env: Env) -> tuple[float | None, float | None]:
    return (
        env.sample("inference_model_input_tokens_sum", LABELS),
        env.sample("inference_model_output_tokens_sum", LABELS),
    )


async def test_json_and_sse_responses_come_through_whole_and_their_usage_is_counted(
    pool: AddressPool,
) -> None:
    async with v1_gateway(pool) as (env, envoy, pods), aiohttp.ClientSession() as http:
        body = {"model": "base", "prompt": "hello there", "max_tokens": 4}
        async with http.post(f"{envoy.base_url}/v1/completions", json=body) as response:
            assert response.status == 200, await response.text()
            assert response.headers[SERVED_BY_HEADER] in pods
            usage = (await response.json())["usage"]
        assert tokens(env) == (usage["prompt_tokens"], usage["completion_tokens"])

        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with http.post(f"{envoy.base_url}/v1/completions", json=stream) as response:
            assert response.status == 200
            raw = (await response.read()).decode()
        events = [line for line in raw.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        streamed = json.loads(events[-2][len("data: ") :])["usage"]
        assert tokens(env) == (
            usage["prompt_tokens"] + streamed["prompt_tokens"],
            usage["completion_tokens"] + streamed["completion_tokens"],
        )


async def test_a_header_only_request_is_routed(pool: AddressPool) -> None:
    async with (
        v1_gateway(pool) as (_, envoy, pods),
        aiohttp.ClientSession() as http,
        http.get(f"{envoy.base_url}/v1/models") as response,
    ):
        assert response.status == 200, await response.text()
        assert response.headers[SERVED_BY_HEADER] in pods


async def test_the_subset_hint_reaches_the_epp_through_envoy(pool: AddressPool) -> None:
    async with v1_gateway(pool) as (env, envoy, pods), aiohttp.ClientSession() as http:
        body = {"model": "base", "prompt": "hi", "max_tokens": 1}
        for hint in (pods[1], pods[1].rsplit(":", 1)[0]):
            async with http.post(
                f"{envoy.base_url}/v1/completions", json=body, headers={SUBSET_HEADER: hint}
            ) as response:
                assert response.status == 200, await response.text()
                assert response.headers[SERVED_BY_HEADER] == pods[1]
        assert env.scheduler.candidates == [["pod-2"], ["pod-2"]]
        async with http.post(
            f"{envoy.base_url}/v1/completions", json=body, headers={SUBSET_HEADER: "10.255.0.1"}
        ) as response:
            assert response.status == 503
            assert "subset" in (await response.json())["error"]["message"]


async def test_a_list_aware_envoy_retries_on_the_fallback(pool: AddressPool) -> None:
    # The pick is a pod nothing listens on; the first fallback (the scripted ranking keeps the pods'
    # order: pod-1) serves every time. Envoy's own round robin, which takes over when the list runs
    # out, would spread some of them over pod-2.
    async with (
        v1_gateway(pool, fallbacks=1, list_aware=True) as (env, envoy, pods),
        aiohttp.ClientSession() as http,
    ):
        env.scheduler.pick = "pod-dead"
        body = {"model": "base", "prompt": "hi", "max_tokens": 1}
        served = []
        for _ in range(6):
            async with http.post(f"{envoy.base_url}/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
                served.append(response.headers[SERVED_BY_HEADER])
    assert served == [pods[0]] * 6
