"""The datastore debug view is not public: its own listener, on loopback unless asked otherwise.

It dumps every pod address and model of the pool, unauthenticated; /metrics must be reachable by
Prometheus from other pods, the debug view only by someone on the EPP's host (kubectl port-forward).
127.0.0.2 stands in for the pod's own address (tests bind loopback addresses only).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import pytest

from epp.config import DEFAULT_DEBUG_BIND_ADDRESS
from epp.server.flags import parse_flags

from .support import LOOPBACK_CONFIG, make_epp

POD_ADDRESS = "127.0.0.2"


async def status(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url) as resp:
        return resp.status


def test_the_datastore_view_is_on_loopback_only_by_default() -> None:
    async def scenario() -> None:
        async with make_epp(config=replace(LOOPBACK_CONFIG, bind_address=POD_ADDRESS)) as epp:
            await epp.wait_ready()
            async with aiohttp.ClientSession() as http:
                assert await status(http, f"http://{POD_ADDRESS}:{epp.metrics_port}/metrics") == 200
                assert await status(http, f"http://{POD_ADDRESS}:{epp.metrics_port}/debug/datastore") == 404
                assert epp.debug_address == DEFAULT_DEBUG_BIND_ADDRESS == "127.0.0.1"
                assert await status(http, f"http://127.0.0.1:{epp.debug_port}/debug/datastore") == 200
                with pytest.raises(aiohttp.ClientConnectionError):
                    await status(http, f"http://{POD_ADDRESS}:{epp.debug_port}/debug/datastore")

    asyncio.run(scenario())


def test_the_datastore_view_can_be_exposed_on_purpose() -> None:
    config = replace(LOOPBACK_CONFIG, debug_bind_address="127.0.0.3")

    async def scenario() -> None:
        async with make_epp(config=config) as epp:
            await epp.wait_ready()
            async with aiohttp.ClientSession() as http:
                assert await status(http, f"http://127.0.0.3:{epp.debug_port}/debug/datastore") == 200

    asyncio.run(scenario())


def test_metrics_alone_can_move_to_another_address() -> None:
    """E.g. loopback, with an authenticating proxy in front (README: exposing /metrics safely)."""
    config = replace(LOOPBACK_CONFIG, bind_address=POD_ADDRESS, metrics_bind_address="127.0.0.3")

    async def scenario() -> None:
        async with make_epp(config=config) as epp:
            await epp.wait_ready()
            async with aiohttp.ClientSession() as http:
                assert await status(http, f"http://127.0.0.3:{epp.metrics_port}/metrics") == 200
                with pytest.raises(aiohttp.ClientConnectionError):
                    await status(http, f"http://{POD_ADDRESS}:{epp.metrics_port}/metrics")

    asyncio.run(scenario())


def test_debug_flags() -> None:
    default = parse_flags(["--poolName", "p"], {}).config
    assert (default.debug_bind_address, default.debug_port) == ("127.0.0.1", 9091)
    exposed = parse_flags(
        ["--poolName", "p", "--debugBindAddress=0.0.0.0", "--debugPort=0", "--metricsBindAddress=127.0.0.1"],
        {},
    ).config
    assert (exposed.debug_bind_address, exposed.debug_port) == ("0.0.0.0", 0)
    assert (exposed.metrics_bind_address, default.metrics_bind_address) == ("127.0.0.1", "")
