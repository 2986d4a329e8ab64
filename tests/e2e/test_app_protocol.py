"""The pool's `appProtocol` towards the model servers, through the real Stack (a v1 pool only).

Each pod's simulator serves HTTP/1.1 and h2c on one port (`SimConfig.h2c`), as an h2c-capable model
server does: its readiness probe and the EPP's scrapes stay HTTP/1.1. The Stack sets Envoy up from
the pool as applied (`harness.beds.stack.gateway_options`), so a pool that says
`kubernetes.io/h2c` gets every request to the pod over HTTP/2, one that says `http` (or nothing,
the CRD's default) over HTTP/1.1; the simulator records which from the socket it came in on.
"""

from __future__ import annotations

import httpx2
import pytest

from harness.beds.stack import BASE_MODEL, Stack, StackOptions
from harness.cluster.releases import V1
from harness.dataplane.envoy import APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP, EnvoyOptions
from harness.plugin.core import namespace_name
from harness.scenarios.support import CLIENT_TIMEOUT_S, POD_PORT, cluster_of, served_by, wait_routable
from harness.sim import SimConfig

pytestmark = [pytest.mark.e2e, pytest.mark.api_generation(V1.name)]

PODS = ("pod-a", "pod-b")


@pytest.fixture(scope="module", params=[APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP], ids=["h2c", "http"])
def shared_stack_options(request: pytest.FixtureRequest) -> StackOptions:
    sim = SimConfig(model=BASE_MODEL, max_num_seqs=8, time_scale=0.001, h2c=True)
    return StackOptions(
        namespace=namespace_name(request.module.__name__),
        pods=0,
        sim_config=sim,
        envoy=EnvoyOptions.v1(),
        app_protocol=request.param,
    )


def test_requests_reach_the_pod_over_the_pools_app_protocol(
    shared_stack: Stack, shared_stack_options: StackOptions
) -> None:
    cluster = cluster_of(shared_stack)
    cluster.add_pods([cluster.pod_body(pod) for pod in PODS])
    wait_routable(shared_stack, list(PODS))
    body = {"model": BASE_MODEL, "prompt": "Which protocol?", "max_tokens": 3}
    with httpx2.Client(base_url=shared_stack.base_url, timeout=CLIENT_TIMEOUT_S) as http:
        served = []
        for _ in range(4):
            response = http.post("/completions", json=body)
            assert response.status_code == 200, response.text
            served.append(served_by(response.headers))
    expected = "2" if shared_stack_options.app_protocol == APP_PROTOCOL_H2C else "1.1"
    versions = {
        request.http_version
        for pod in PODS
        for request in cluster.pods[pod].sim(POD_PORT).received_requests()
    }
    assert versions == {expected}, f"served by {served}"
