"""The HTTP side of the prober against a real local server: status, timeout, refusal, keep-alive."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from epp.backend.metrics.fetch import MetricsFetcher, ScrapeError, metrics_url, new_scrape_session

Handler = Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]


def serve(handler: Handler, scenario: Callable[[MetricsFetcher, int], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        session = new_scrape_session()
        try:
            assert server.port is not None
            await scenario(MetricsFetcher(session, timeout=0.5), server.port)
        finally:
            await session.close()
            await server.close()

    asyncio.run(main())


def test_ok_page_and_keep_alive() -> None:
    peers: list[object] = []

    async def handler(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text="vllm:num_requests_waiting 3\n")

    async def scenario(fetcher: MetricsFetcher, port: int) -> None:
        assert await fetcher.fetch("127.0.0.1", port) == "vllm:num_requests_waiting 3\n"
        assert await fetcher.fetch("127.0.0.1", port) == "vllm:num_requests_waiting 3\n"

    serve(handler, scenario)
    assert len(peers) == 2
    assert peers[0] == peers[1], "the second scrape reuses the first connection"


def test_non_200_is_a_scrape_error() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    async def scenario(fetcher: MetricsFetcher, port: int) -> None:
        with pytest.raises(ScrapeError, match="HTTP 503"):
            await fetcher.fetch("127.0.0.1", port)

    serve(handler, scenario)


def test_timeout_is_a_scrape_error() -> None:
    async def handler(request: web.Request) -> web.Response:
        await asyncio.Event().wait()  # never answers; cancelled when the server closes
        raise AssertionError("unreachable")

    async def scenario(fetcher: MetricsFetcher, port: int) -> None:
        with pytest.raises(ScrapeError, match="timed out"):
            await fetcher.fetch("127.0.0.1", port)

    serve(handler, scenario)


def test_connection_refused_is_a_scrape_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the fetch: nothing listens there

    async def main() -> None:
        session = new_scrape_session()
        try:
            with pytest.raises(ScrapeError, match=f"127.0.0.1:{port}"):
                await MetricsFetcher(session).fetch("127.0.0.1", port)
        finally:
            await session.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("address", "url"),
    [
        pytest.param("10.1.2.3", "http://10.1.2.3:8000/metrics", id="ipv4"),
        pytest.param("fd00::1", "http://[fd00::1]:8000/metrics", id="ipv6-bracketed"),
    ],
)
def test_metrics_url(address: str, url: str) -> None:
    assert metrics_url(address, 8000) == url
