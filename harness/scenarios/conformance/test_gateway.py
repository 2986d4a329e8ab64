"""Upstream's gateway conformance (`conformance@v1.6.0`), the part that needs no Gateway controller,
on Envoy plus any EPP: what the gateway does with the pool and the EPP's answers.

Upstream's tests run on a real Gateway implementation; here the Stack is the gateway: it sets Envoy
up from the pool as applied (`harness.beds.stack.gateway_options`: `failureMode`, `appProtocol`)
and keeps Envoy's model-server cluster equal to the pool's endpoints
(`harness.dataplane.pool_endpoints`), with the list-aware cluster (`follow_pool_endpoints`) that a
fail-open gateway needs to have anywhere to send a request without its EPP.

* EppUnAvailableFailOpen (and its FailClose counterpart): the EPP is made unavailable as upstream's
  test makes it (its Service left without endpoints): the process is killed and the gateway's EPP
  cluster, which follows that Service (`ext_proc_dynamic_endpoints`), loses its endpoint. FailOpen
  still serves every request from a pool pod, FailClose answers 5xx and nothing reaches a pod.
  Killing the process alone leaves a dead endpoint listed: every request then opens a stream that
  fails only after Envoy has sent it the body, and in FULL_DUPLEX_STREAMED (the v1 set-up) Envoy
  1.40 fails open only before the first body chunk has gone (envoyproxy/envoy #41276), so it answers
  502 `ext_proc_error_gRPC_error_14` whatever the pool says (measured with llm-d-router and with our
  EPP under the v1 flag profile alike: no EPP is involved once it is dead).
* GatewayFollowingEPPRoutingWithDataParallelism: one pod, several target ports (data-parallel
  ranks, v1 only): every rank gets traffic. Each request has a prompt of its own: an EPP with
  prefix-cache affinity (llm-d-router's default profile, upstream v1.5.0's) rightly keeps one
  repeated prompt on the rank that served it, which says nothing about the ranks being endpoints.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx2
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, ModelSpec, Stack
from harness.cluster.releases import V1
from harness.dataplane.envoy import EnvoyOptions
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import cluster_of, endpoint, served_by

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic]

MODEL = BASE_MODEL  # served as itself: a request the EPP never saw is still a valid one
MODELS = (ModelSpec("llama", MODEL, "Critical"),)
# The gateway follows the pool's endpoints (somewhere to send a request without the EPP) and the
# EPP Service's (so an unavailable EPP is no endpoint at all, as a Service without ready pods).
GATEWAY = EnvoyOptions(follow_pool_endpoints=True, ext_proc_dynamic_endpoints=True)
REQUESTS = 6
RANKS = (8000, 8001, 8002)


def complete(stack: Stack, http: httpx2.Client, prompt: str = "hello gateway") -> httpx2.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    return http.post("/completions", json=body, headers=cluster_of(stack).objective_headers(MODEL))


def received_by_pods(stack: Stack) -> int:
    cluster = cluster_of(stack)
    return sum(len(cluster.pods[name].sim().received_requests()) for name in cluster.pods)


def make_the_epp_unavailable(stack: Stack, noticed: Callable[[httpx2.Response], bool]) -> None:
    """Kill the EPP (served before) and take it out of the gateway's EPP endpoints, as its Service
    has none left; return once a request gets the answer `noticed` waits for, i.e. Envoy has found
    its EPP gone."""
    assert stack.epp_process is not None
    assert stack.envoy is not None
    with httpx2.Client(base_url=stack.base_url, timeout=60) as http:
        assert complete(stack, http).status_code == 200, "not served before the EPP went"
        stack.epp_process.kill()
        stack.envoy.set_ext_proc_replicas(())

        def answered() -> None:
            response = complete(stack, http)
            assert noticed(response), f"{response.status_code} {response.text[:200]!r}"

        eventually(
            answered, timeout=30, message="Envoy answers as the pool's failureMode says without its EPP"
        )


def answers(stack: Stack) -> list[httpx2.Response]:
    with httpx2.Client(base_url=stack.base_url, timeout=60) as http:
        return [complete(stack, http) for _ in range(REQUESTS)]


def test_fail_open_serves_from_a_pool_pod_when_the_epp_is_down(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2, models=MODELS, envoy=GATEWAY, failure_mode="FailOpen")
    pods = {endpoint(stack, name) for name in cluster_of(stack).pods}
    make_the_epp_unavailable(stack, lambda r: r.status_code == 200)

    served = answers(stack)

    assert [r.status_code for r in served] == [200] * REQUESTS, [r.text[:200] for r in served]
    assert {served_by(r.headers) for r in served} <= pods


def test_fail_close_refuses_every_request_when_the_epp_is_down(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2, models=MODELS, envoy=GATEWAY, failure_mode="FailClose")
    make_the_epp_unavailable(stack, lambda r: r.status_code >= 500)
    before = received_by_pods(stack)

    refused = answers(stack)

    assert all(r.status_code >= 500 for r in refused), [r.status_code for r in refused]
    assert received_by_pods(stack) == before, "a request reached a pod without the EPP"


@pytest.mark.api_generation(V1.name)
def test_every_data_parallel_rank_of_a_pod_gets_traffic(stack_factory: StackFactory) -> None:
    """One pod serving on three target ports, each rank its own model server: the pool's endpoints
    are (pod, port) pairs, and traffic reaches all three (upstream's DP conformance test)."""
    stack = stack_factory(pods=0, models=MODELS, envoy=GATEWAY)
    cluster = cluster_of(stack)
    cluster.apply_pool(port=list(RANKS))
    [pod] = cluster.add_pods([cluster.pod_body("ranks", ports=RANKS)])
    wanted = {f"{pod.ip}:{port}" for port in RANKS}
    seen: set[str] = set()

    with httpx2.Client(base_url=stack.base_url, timeout=60) as http:

        def every_rank_served() -> None:
            for _ in range(len(RANKS) * 2):
                response = complete(stack, http, f"rank {uuid.uuid4().hex}")
                if response.status_code == 200:
                    seen.add(served_by(response.headers))
            assert seen == wanted, f"ranks served so far: {sorted(seen)}; want {sorted(wanted)}"

        eventually(every_rank_served, timeout=60, message="traffic reaches every rank of the pod")
    for port in RANKS:
        assert pod.sim(port).received_requests(), f"rank {port}'s model server counted nothing"
