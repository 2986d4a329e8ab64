"""The simulator with `SimConfig.h2c`: HTTP/1.1 and HTTP/2 prior knowledge on one serving port.

What each request came in over is recorded (`ReceivedRequest.http_version`), from the socket the
front handed it on, never from anything the client sends. Streams of one connection run at once,
and an SSE answer streams through the front whole.
"""

from __future__ import annotations

import json

import httpx2
import pytest

from harness.sim import SERVED_BY_HEADER, ModelServerSim, SimConfig

pytestmark = pytest.mark.anyio

H2C = SimConfig(model="base", time_scale=0.001, h2c=True)
BODY = {"model": "base", "prompt": "hello", "max_tokens": 3}


async def test_one_port_serves_http1_and_h2c_and_records_which(address: str) -> None:
    async with ModelServerSim(address, 0, H2C) as sim:
        async with httpx2.AsyncClient(base_url=sim.base_url) as h1:
            response = await h1.post("/v1/completions", json=BODY, headers={"x-test": "one"})
            assert (response.status_code, response.http_version) == (200, "HTTP/1.1")
            assert (await h1.get("/metrics")).status_code == 200
        async with httpx2.AsyncClient(base_url=sim.base_url, http1=False, http2=True) as h2:
            response = await h2.post("/v1/completions", json=BODY, headers={"x-test": "two"})
            assert (response.status_code, response.http_version) == (200, "HTTP/2")
            assert response.headers[SERVED_BY_HEADER] == sim.address
            assert response.json()["usage"]["completion_tokens"] == 3
        received = sim.received_requests()
    assert [(r.http_version, r.header_values("x-test")) for r in received] == [
        ("1.1", ["one"]),
        ("2", ["two"]),
    ]
    assert json.loads(received[1].body) == BODY


async def test_an_sse_answer_streams_over_h2c(address: str) -> None:
    async with (
        ModelServerSim(address, 0, H2C) as sim,
        httpx2.AsyncClient(base_url=sim.base_url, http1=False, http2=True) as h2,
        h2.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as response,
    ):
        assert response.http_version == "HTTP/2"
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert len(lines) == 3 + 1  # one event per token, then [DONE]


async def test_without_h2c_an_http2_client_is_refused(address: str) -> None:
    async with (
        ModelServerSim(address, 0, SimConfig(model="base", time_scale=0.001)) as sim,
        httpx2.AsyncClient(base_url=sim.base_url, http1=False, http2=True) as h2,
    ):
        with pytest.raises(httpx2.HTTPError):
            await h2.post("/v1/completions", json=BODY)
