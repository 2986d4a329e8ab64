"""What reaches a model server, not only where it went (STYLE habit 21), whatever the client sent.

Through the real Envoy and EPP process, the simulator that served each request is asked what it
received: exactly one `x-gateway-destination-endpoint`, equal to its own address; the model name
rewritten to the resolved target (every other byte as the client sent it) and Content-Length to
match; none of the client's own destination or `x-envoy-*` headers. The module's Stack has a small
body limit (one number for Envoy and the EPP); `tests/e2e/test_body_limit.py` checks it on our EPP.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from harness.beds.stack import BASE_MODEL, DEMO_ADAPTERS, Stack, StackOptions
from harness.dataplane.envoy import EnvoyOptions
from harness.plugin.core import namespace_name
from harness.scenarios.support import (
    DESTINATION_HEADER,
    POD_PORT,
    cluster_of,
    endpoint,
    served_by,
    wait_routable,
)
from harness.sim import ReceivedRequest, SimAdmin, SimConfig

pytestmark = pytest.mark.e2e

PODS = ("pod-a", "pod-b", "pod-c")
BODY_LIMIT = 256 * 1024
# What a client adds to steer the gateway: a destination of its choosing, twice, and Envoy's own
# control headers (timeouts, retries, the original-destination host, made-up ones).
CLIENT_HEADERS: list[tuple[str, str]] = [
    (DESTINATION_HEADER, "192.0.2.10:8000"),
    (DESTINATION_HEADER, "192.0.2.11:8000"),
    ("x-envoy-original-dst-host", "192.0.2.12:8000"),
    ("x-envoy-upstream-rq-timeout-ms", "1"),
    ("x-envoy-retry-on", "5xx"),
    ("x-envoy-internal", "true"),
    ("x-envoy-made-up", "client"),
]


def stack_options(request: pytest.FixtureRequest, envoy: EnvoyOptions | None = None) -> StackOptions:
    """This module's Stack: no pods yet, three adapter slots, Envoy's body limit ``BODY_LIMIT``
    (``envoy`` for another body mode, with the same limit)."""
    sim = SimConfig(model=BASE_MODEL, lora_adapters=DEMO_ADAPTERS, max_loras=3, time_scale=0.001)
    return StackOptions(
        namespace=namespace_name(request.module.__name__),
        pods=0,
        sim_config=sim,
        envoy=envoy or EnvoyOptions(buffer_limit_bytes=BODY_LIMIT),
    )


@pytest.fixture(scope="module")
def shared_stack_options(request: pytest.FixtureRequest) -> StackOptions:
    return stack_options(request)


@pytest.fixture(scope="module")
def stack(shared_stack: Stack) -> Stack:
    cluster = cluster_of(shared_stack)
    cluster.add_pods([cluster.pod_body(pod) for pod in PODS])
    wait_routable(shared_stack, list(PODS))
    return shared_stack


def sim_at(stack: Stack, address: str) -> SimAdmin:
    [pod] = [name for name in cluster_of(stack).pods if endpoint(stack, name) == address]
    return cluster_of(stack).pods[pod].sim(POD_PORT)


def send(stack: Stack, path: str, body: bytes, headers: list[tuple[str, str]]) -> httpx2.Response:
    with httpx2.Client(base_url=stack.base_url, timeout=60) as http:
        return http.post(path, content=body, headers=[("content-type", "application/json"), *headers])


def received_by(stack: Stack, response: httpx2.Response, path: str) -> tuple[str, ReceivedRequest]:
    """The serving simulator's address and the last request it received on `path`."""
    address = served_by(response.headers)
    [*_, last] = [r for r in sim_at(stack, address).received_requests() if r.path == path]
    return address, last


@pytest.mark.parametrize(
    ("path", "fields", "targets"),
    [
        pytest.param(
            "/v1/completions",
            {"model": "food-review", "prompt": "Write a review", "max_tokens": 2, "temperature": 1e999},
            {"food-review-1", "food-review-2"},
            id="weighted-split-rewritten",
            marks=[pytest.mark.departure("body-bytes-preserved"), pytest.mark.needs("model-aware-routing")],
        ),
        pytest.param(
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "crème brûlée"}], "model": "sql-lora", "max_tokens": 2},
            {"sql-lora-v1"},
            id="lora-target-rewritten",
            marks=[pytest.mark.departure("body-bytes-preserved"), pytest.mark.needs("model-aware-routing")],
        ),
        pytest.param(
            "/v1/completions",
            {"model": BASE_MODEL, "prompt": "hello", "max_tokens": 2},
            {BASE_MODEL},
            id="base-model-untouched",
            # v1.x re-marshals every body, rewritten or not (v0.3.0 passed an untouched one through).
            marks=pytest.mark.departure("body-bytes-preserved"),
        ),
    ],
)
@pytest.mark.epp_agnostic
def test_the_model_server_gets_one_destination_and_the_resolved_model(
    stack: Stack, path: str, fields: dict[str, Any], targets: set[str]
) -> None:
    # The client's own formatting (spaces, raw UTF-8, an out-of-range number) must survive.
    sent = json.dumps(fields, ensure_ascii=False, indent=1).replace("Infinity", "1e999").encode()
    for _ in range(3):
        response = send(stack, path.removeprefix("/v1"), sent, CLIENT_HEADERS)
        assert response.status_code == 200, response.text
        address, received = received_by(stack, response, path)

        assert received.header_values(DESTINATION_HEADER) == [address]
        model = json.loads(received.body)["model"]
        assert model in targets
        assert received.body == sent.replace(f'"{fields["model"]}"'.encode(), json.dumps(model).encode(), 1)
        assert received.header_values("content-length") == [str(len(received.body))]
        for name, value in CLIENT_HEADERS:
            if name != DESTINATION_HEADER:
                assert name not in {key for key, _ in received.headers}, f"{name} reached the model server"
            assert value not in received.header_values(name)
