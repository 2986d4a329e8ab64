"""A client-supplied ``x-gateway-destination-endpoint`` header cannot steer traffic.

Envoy's ORIGINAL_DST cluster takes the destination only from the EPP's dynamic metadata, and the EPP
strips the client's header and sets its own. One Stack for the module, laid out so the EPP's pick is
known: `routable` is the only pod the EPP would choose; the header names somewhere else each time.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.beds.stack import Stack, StackOptions
from harness.plugin.core import namespace_name
from harness.scenarios.support import (
    DESTINATION_HEADER,
    access_log_since,
    cluster_of,
    endpoint,
    openai_client,
    requests_by_model,
    served_by,
    settled_access_log,
    wait_queues_seen,
    wait_routable,
)

pytestmark = pytest.mark.e2e

ROUTABLE = "routable"
NOT_READY = "not-ready"
BUSY = "busy"
OUTSIDE = "outside-pool"
# The busy pod's reported queue: with the routable pod at 0, "least queuing" keeps only the
# routable one (band [0, 0 + 3 // 2]).
BUSY_QUEUE = 3
REQUESTS = 10


@pytest.fixture(scope="module")
def shared_stack_options(request: pytest.FixtureRequest) -> StackOptions:
    return StackOptions(namespace=namespace_name(request.module.__name__), pods=0)


@pytest.fixture(scope="module")
def layout(shared_stack: Stack) -> Stack:
    cluster = cluster_of(shared_stack)
    cluster.add_pod(ROUTABLE)
    cluster.add_pod(BUSY)
    cluster.add_pod(NOT_READY, ready=False)
    cluster.add_pod(OUTSIDE, labels={"app": "not-the-pool"})
    cluster.set_gauges(BUSY, waiting=BUSY_QUEUE)
    wait_routable(shared_stack, [BUSY, ROUTABLE])
    wait_queues_seen(shared_stack, {BUSY: BUSY_QUEUE, ROUTABLE: 0})
    return shared_stack


def pod_address(pod: str) -> Callable[[Stack], str]:
    return lambda stack: endpoint(stack, pod)


def envoy_admin(stack: Stack) -> str:
    assert stack.envoy is not None
    return f"127.0.0.1:{stack.envoy.admin_port}"


@pytest.mark.parametrize(
    "steer_to",
    [
        pytest.param(pod_address(NOT_READY), id="pod-not-ready"),
        pytest.param(pod_address(BUSY), id="ready-pod-the-epp-does-not-pick"),
        pytest.param(pod_address(OUTSIDE), id="pod-outside-the-pool"),
        pytest.param(envoy_admin, id="envoy-admin-port"),
    ],
)
def test_client_header_cannot_steer_traffic(layout: Stack, steer_to: Callable[[Stack], str]) -> None:
    target = steer_to(layout)
    picked = endpoint(layout, ROUTABLE)
    counts_before = requests_by_model(layout)
    log_start = len(settled_access_log(layout))
    with openai_client(layout) as client:
        answered = [
            served_by(
                client.completions.with_raw_response.create(
                    model="food-review",
                    prompt="hello",
                    max_tokens=1,
                    extra_headers={DESTINATION_HEADER: target},
                ).headers
            )
            for _ in range(REQUESTS)
        ]

    assert answered == [picked] * REQUESTS
    for entry in access_log_since(layout, log_start):
        assert entry["upstream_host"] == picked, entry
        assert entry["destination_metadata"] == picked, entry
        assert entry["destination_header"] == picked, "the EPP replaced the client's header"
    counts_after = requests_by_model(layout)
    for pod in (NOT_READY, BUSY, OUTSIDE):
        assert counts_after[pod] == counts_before[pod], f"{pod} received traffic"
