"""The v1 destination's fallbacks honoured by a real Envoy in v1 mode (`EnvoyOptions.v1`).

The EPP sends a comma list, its pick first; Envoy's model-server cluster follows the pool's Ready
endpoints (`harness.dataplane.pool_endpoints`) and its override_host policy moves to the next
address of the list when one refuses the connection. Here the pick is a pod whose model server has
died while the API still calls it Ready (a forged pod: no kubelet reports a lost node at once): its
gauges say it is the idlest, so the EPP ranks it first, then `pod-b` (a short queue), then `pod-c`
(a long one). Every request must be served by `pod-b`, the first fallback: Envoy's own round robin,
which takes over when the list runs out, would also send some to `pod-c`.
"""

from __future__ import annotations

import httpx2
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, Stack, StackOptions
from harness.dataplane.envoy import EnvoyOptions
from harness.plugin.core import namespace_name
from harness.scenarios.support import (
    CLIENT_TIMEOUT_S,
    cluster_of,
    endpoint,
    served_by,
    wait_queues_seen,
    wait_routable,
)
from harness.sim import SimConfig

pytestmark = [pytest.mark.e2e]

DEAD, FIRST_FALLBACK, LAST = "pod-a", "pod-b", "pod-c"
REQUESTS = 8


@pytest.fixture(scope="module")
def shared_stack_options(request: pytest.FixtureRequest) -> StackOptions:
    sim = SimConfig(model=BASE_MODEL, max_num_seqs=8, time_scale=0.001)
    return StackOptions(
        namespace=namespace_name(request.module.__name__),
        pods=0,
        sim_config=sim,
        envoy=EnvoyOptions.v1(),
        # The dead pick keeps its last metrics for the whole test (its scrapes now fail).
        epp_args=["--metrics-staleness-threshold=120s"],
    )


def released(stack: Stack) -> None:
    """Until the EPP counts no request in flight on any pod.

    Envoy ends a request's ext_proc stream only after the response has reached the client, so the
    next request can be ranked while the last one still counts on `pod-b`: the EPP then rightly
    ranks `pod-c` second, and the list no longer says which endpoint is the first fallback. Each
    request is sent once the last one's count is released: with the pinned gauges, the same ranking
    each time.
    """

    def check() -> None:
        pods = stack.datastore_view().get("pods") or []
        counted = {p["name"]: p["inFlight"] for p in pods if p["inFlight"]}
        assert not counted, f"the EPP still counts requests in flight: {counted}"

    eventually(check, timeout=10.0, message="the EPP released the last request")


def test_a_pick_that_refuses_the_connection_is_served_by_the_first_fallback(shared_stack: Stack) -> None:
    cluster = cluster_of(shared_stack)
    cluster.add_forged_pod(DEAD)
    cluster.add_pods([cluster.pod_body(FIRST_FALLBACK), cluster.pod_body(LAST)])
    # Running pinned at 0 too: a scrape that caught a request of this test running on pod-b would
    # make it look busy to the predicted-TTFT scorer, which then ranks pod-c second (seen in CI).
    cluster.set_gauges(DEAD, waiting=0, running=0, kv_cache=0.0)
    cluster.set_gauges(FIRST_FALLBACK, waiting=2, running=0, kv_cache=0.1)
    cluster.set_gauges(LAST, waiting=6, running=0, kv_cache=0.5)
    wait_routable(shared_stack, [DEAD, FIRST_FALLBACK, LAST])
    # The ranking below rests on these queues: the first scrape may predate the pins.
    wait_queues_seen(shared_stack, {DEAD: 0, FIRST_FALLBACK: 2, LAST: 6})
    assert shared_stack.pool_endpoints is not None
    shared_stack.pool_endpoints.wait_published(
        [endpoint(shared_stack, p) for p in (DEAD, FIRST_FALLBACK, LAST)]
    )

    cluster.forged_server_dies(DEAD)
    body = {"model": BASE_MODEL, "prompt": "Say hi to the fallback", "max_tokens": 3}
    served = []
    with httpx2.Client(base_url=shared_stack.base_url, timeout=CLIENT_TIMEOUT_S) as http:
        for _ in range(REQUESTS):
            response = http.post("/completions", json=body)
            assert response.status_code == 200, response.text
            served.append(served_by(response.headers))
            # Envoy reports the served endpoint to the EPP on the response (metadata); never to the client.
            assert "x-gateway-destination-endpoint-served" not in response.headers
            released(shared_stack)

    # The lists the EPP sent, from Envoy's access log: what a wrong server is judged against.
    envoy = shared_stack.envoy
    assert envoy is not None

    def picks() -> list[str]:
        entries = [e for e in envoy.access_log() if e["path"] == "/v1/completions"]
        assert len(entries) >= REQUESTS, f"{len(entries)} completions in the access log so far"
        return [e["destination_metadata"] for e in entries[-REQUESTS:]]

    lists = eventually(picks, timeout=5.0, message="Envoy flushed its access log")
    assert served == [endpoint(shared_stack, FIRST_FALLBACK)] * REQUESTS, f"lists sent: {lists}"
    # The EPP did pick the dead pod first each time: the list Envoy walked starts with it.
    assert all(p.split(",")[0] == endpoint(shared_stack, DEAD) for p in lists), lists
