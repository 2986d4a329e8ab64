"""The model servers' protocol from the pool's `appProtocol`: `kubernetes.io/h2c` makes Envoy speak
HTTP/2 (prior knowledge) to them, `http` leaves it at HTTP/1.1, whatever the client spoke.

A simulator that serves both on one port (`SimConfig.h2c`) records which one each request came in
over; Envoy goes straight to it (`direct_upstream`, no EPP), so only the cluster's protocol matters.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from harness.base.addresses import AddressPool
from harness.dataplane.envoy import (
    APP_PROTOCOL_H2C,
    APP_PROTOCOL_HTTP,
    Envoy,
    EnvoyOptions,
    ModelServerProtocol,
    model_server_protocol_options,
)
from harness.sim import ModelServerSim, SimConfig

pytestmark = pytest.mark.anyio

SIM = SimConfig(model="base", time_scale=0.001, h2c=True)


@pytest.fixture
def address() -> Iterator[str]:
    with AddressPool() as pool:
        yield pool.acquire()


@pytest.mark.parametrize(
    ("app_protocol", "arrives_as"),
    [pytest.param(APP_PROTOCOL_H2C, "2", id="h2c"), pytest.param(APP_PROTOCOL_HTTP, "1.1", id="http")],
)
async def test_the_model_server_is_spoken_to_as_the_pool_says(
    address: str, app_protocol: ModelServerProtocol, arrives_as: str
) -> None:
    async with ModelServerSim(address, 0, SIM) as sim:
        options = EnvoyOptions(
            direct_upstream=sim.address, ext_proc_tls=False, model_server_protocol=app_protocol
        )
        with Envoy("127.0.0.1:9", options=options) as envoy:
            async with aiohttp.ClientSession() as http:
                body = {"model": "base", "prompt": "hi", "max_tokens": 2}
                async with http.post(f"{envoy.base_url}/v1/completions", json=body) as response:
                    assert response.status == 200, await response.text()
        [received] = sim.received_requests()
    assert received.http_version == arrives_as


def test_an_unknown_app_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown appProtocol 'h3'"):
        model_server_protocol_options("h3")  # type: ignore[arg-type]
