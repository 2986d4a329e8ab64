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
* GatewayWeightedAcrossTwoInferencePools: one route, two pools weighted 70/30, an EPP each
  (`harness.dataplane.weighted_pools`): 200 requests, 5 at a time, split by weight within upstream's
  tolerance (the larger of 0.10 and 4.5 sigma), and each one served by a pod of the pool Envoy sent
  it to, the very endpoint that pool's EPP picked (the access log's `upstream_cluster`,
  `upstream_host` and the EPP's metadata). A pool's EPP only knows its own pods (the pool-boundaries
  scenario), so a pick inside the pool means that pool's EPP was asked. The weighted Envoy is always
  a process (``--envoy=container`` runs the Stacks' own Envoys in containers, not this one).
* GatewayFollowingEPPRouting and GatewayDestinationEndpointServed, with upstream's test plugins
  (`needs("test-plugins")`: `harness.subject.flag_profiles.test_plugin_args` configures them in a full
  EPP, ours included; lwepp has them built in): a request whose `test-epp-endpoint-selection` header
  names a pod is served by that pod, and its response's `x-conformance-test-served-endpoint` (the EPP
  echoing what Envoy reported in `envoy.lb` metadata) is that pod's endpoint. With the filter, a
  request without the header has no candidate, so the Stack applies nothing and waits for nothing
  itself (`apply_pool=False`): the scenario applies the pool and waits with the header.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, ModelSpec, Stack
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.releases import V1
from harness.dataplane.envoy import EnvoyOptions
from harness.dataplane.pool_endpoints import PoolEndpointsFollower
from harness.dataplane.weighted_pools import WeightedPool, WeightedPoolsEnvoy
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import POD_PORT, cluster_of, endpoint, served_by, skip_unless_two_can_run
from harness.subject import flag_profiles
from harness.subject.foreign_epp import EppCommand

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic]

MODEL = BASE_MODEL  # served as itself: a request the EPP never saw is still a valid one
MODELS = (ModelSpec("llama", MODEL, "Critical"),)
# The gateway follows the pool's endpoints (somewhere to send a request without the EPP) and the
# EPP Service's (so an unavailable EPP is no endpoint at all, as a Service without ready pods).
GATEWAY = EnvoyOptions(follow_pool_endpoints=True, ext_proc_dynamic_endpoints=True)
REQUESTS = 6
RANKS = (8000, 8001, 8002)
# GatewayWeightedAcrossTwoInferencePools: its weights, sample and concurrency; 3 pods per pool.
SECONDARY_POOL = "secondary-pool"
SECONDARY_MODELS = (ModelSpec("llama-secondary", MODEL, "Critical"),)
WEIGHTS = (70, 30)
SPLIT_REQUESTS = 200
SPLIT_CONCURRENCY = 5
POOL_PODS = 3


def complete(
    stack: Stack, http: httpx2.Client, prompt: str = "hello gateway", headers: dict[str, str] | None = None
) -> httpx2.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    sent = {**cluster_of(stack).objective_headers(MODEL), **(headers or {})}
    return http.post("/completions", json=body, headers=sent)


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


@contextlib.contextmanager
def weighted_envoy(stacks: Sequence[Stack], weights: Sequence[int]) -> Iterator[WeightedPoolsEnvoy]:
    """One Envoy whose route splits across the Stacks' pools by `weights`, each pool's requests
    routed by that Stack's EPP, each pool's cluster following that pool's endpoints."""
    pools = []
    for stack, weight in zip(stacks, weights, strict=True):
        process = stack.epp_process
        assert process is not None
        assert stack.envoy is not None
        pools.append(
            WeightedPool(stack.options.pool_name, weight, process.ext_proc_address, process.ext_proc_tls)
        )
    # As the Stacks' own Envoys are set up for their EPP (its body modes), but list-aware with the
    # EPP fixed (one replica each).
    first_envoy = stacks[0].envoy
    assert first_envoy is not None
    options = dataclasses.replace(first_envoy.options, ext_proc_dynamic_endpoints=False)
    with WeightedPoolsEnvoy(pools, options=options) as envoy, contextlib.ExitStack() as followers:
        for stack in stacks:
            cluster = cluster_of(stack)
            follower = PoolEndpointsFollower(
                cluster.kube, cluster.namespace, cluster.pool_name,
                functools.partial(envoy.set_pool_endpoints, cluster.pool_name),
            ).start()  # fmt: skip
            followers.callback(follower.stop)
        yield envoy


def served_pools(envoy: WeightedPoolsEnvoy, entries: Sequence[dict[str, Any]]) -> set[str | None]:
    return {envoy.pool_of_cluster(str(entry.get("upstream_cluster"))) for entry in entries}


def test_traffic_splits_by_weight_across_two_pools_each_routed_by_its_own_epp(
    stack_factory: StackFactory, control_plane: ClusterAccess, epp_command: EppCommand | None
) -> None:
    skip_unless_two_can_run(epp_command)
    primary = stack_factory(pods=POOL_PODS, models=MODELS, envoy=EnvoyOptions(follow_pool_endpoints=True))
    options = dataclasses.replace(primary.options, pool_name=SECONDARY_POOL, models=SECONDARY_MODELS)
    with Stack(control_plane, options) as secondary, weighted_envoy((primary, secondary), WEIGHTS) as envoy:
        pool_of_pod = {
            endpoint(stack, name): stack.options.pool_name
            for stack in (primary, secondary)
            for name in cluster_of(stack).pods
        }
        body = {"model": MODEL, "prompt": "Write as if you were a critic: San Francisco", "max_tokens": 1}
        with httpx2.Client(base_url=f"{envoy.base_url}/v1", timeout=60) as http:

            def both_pools_serve() -> None:  # each pool's cluster has its endpoints, each EPP answers
                for _ in range(8):
                    response = http.post("/completions", json=body)
                    assert response.status_code == 200, f"{response.status_code} {response.text[:200]!r}"
                pools = served_pools(envoy, envoy.flushed_access_log())
                assert pools == {primary.options.pool_name, SECONDARY_POOL}, f"pools served so far: {pools}"

            eventually(both_pools_serve, timeout=60, message="both pools serve through the weighted route")
            before = len(envoy.flushed_access_log())
            with ThreadPoolExecutor(SPLIT_CONCURRENCY) as workers:
                statuses = list(workers.map(lambda _: http.post("/completions", json=body).status_code,
                                            range(SPLIT_REQUESTS)))  # fmt: skip
        assert statuses == [200] * SPLIT_REQUESTS, f"not every request was served: {statuses}"
        entries = envoy.flushed_access_log()[before:]

    assert len(entries) == SPLIT_REQUESTS
    hits = {primary.options.pool_name: 0, SECONDARY_POOL: 0}
    for entry in entries:
        pool = envoy.pool_of_cluster(str(entry["upstream_cluster"]))
        host = entry["upstream_host"]
        picked = str(entry["destination_metadata"]).split(",")[0]
        assert pool is not None, f"a request went to cluster {entry['upstream_cluster']!r}, no pool's"
        assert pool_of_pod.get(host) == pool, (
            f"routed to pool {pool} but served by {host} ({pool_of_pod.get(host) or 'no pool'}'s pod)"
        )
        assert picked == host, (
            f"pool {pool}'s request was served by {host}, not by the endpoint its EPP picked ({picked!r}): "
            "the gateway asked another pool's EPP, or ignored the pick"
        )
        hits[pool] += 1
    expected = WEIGHTS[0] / sum(WEIGHTS)
    observed = hits[primary.options.pool_name] / SPLIT_REQUESTS
    tolerance = max(0.10, 4.5 * math.sqrt(expected * (1 - expected) / SPLIT_REQUESTS))
    assert abs(observed - expected) <= tolerance, (
        f"weighted split out of bounds: primary {observed:.3f} ({hits}), "
        f"expected {expected:.3f} ± {tolerance:.3f}"
    )


# --- upstream's test plugins: GatewayFollowingEPPRouting, GatewayDestinationEndpointServed ----------
SELECTION_HEADER = "test-epp-endpoint-selection"
SERVED_RESULT_HEADER = "x-conformance-test-served-endpoint"
SELECTED_REQUESTS = 3


def stack_with_test_plugins(
    stack_factory: StackFactory, epp_command: EppCommand | None, envoy: EnvoyOptions
) -> tuple[Stack, list[str]]:
    """A Stack whose EPP runs upstream's test plugins, its pool and POOL_PODS pods applied after it
    started; the pods' endpoints ("ip:port")."""
    profile = flag_profiles.V1 if epp_command is None else epp_command.flags
    stack = stack_factory(
        pods=0, models=MODELS, envoy=envoy, epp_args=list(flag_profiles.test_plugin_args(profile)),
        apply_pool=False,
    )  # fmt: skip
    cluster = cluster_of(stack)
    cluster.apply_pool()
    for model in MODELS:
        cluster.apply_model(model.name, model.model_name, criticality=model.criticality)
    pods = cluster.add_pods([cluster.pod_body(f"{cluster.pool_name}-{i}") for i in range(POOL_PODS)])
    return stack, [f"{pod.ip}:{POD_PORT}" for pod in pods]


def selected(stack: Stack, http: httpx2.Client, endpoint: str) -> httpx2.Response:
    """A completion whose selection header names `endpoint`'s pod (its IP, as upstream's tests send)."""
    ip = endpoint.rsplit(":", 1)[0]
    return complete(stack, http, f"for {ip}", headers={SELECTION_HEADER: ip})


def served_as_asked(stack: Stack, http: httpx2.Client, wanted: str, *, echoed: bool) -> None:
    """A request naming `wanted` is served by it (and, if `echoed`, the EPP says it was)."""
    response = selected(stack, http, wanted)
    assert response.status_code == 200, f"{response.status_code} {response.text[:200]!r}"
    assert served_by(response.headers) == wanted
    if echoed:
        assert response.headers.get(SERVED_RESULT_HEADER) == wanted, dict(response.headers)


@pytest.mark.needs("test-plugins")
def test_traffic_follows_the_endpoint_the_selection_header_names(
    stack_factory: StackFactory, epp_command: EppCommand | None
) -> None:
    stack, endpoints = stack_with_test_plugins(
        stack_factory, epp_command, EnvoyOptions(follow_pool_endpoints=True)
    )
    with httpx2.Client(base_url=stack.base_url, timeout=60) as http:
        for wanted in endpoints:
            # Once the EPP and the gateway know the pod, every request naming it goes there.
            check = functools.partial(served_as_asked, stack, http, wanted, echoed=False)
            eventually(check, timeout=60, message=f"a request naming {wanted} is served by it")
            served = [served_by(selected(stack, http, wanted).headers) for _ in range(SELECTED_REQUESTS)]
            assert served == [wanted] * SELECTED_REQUESTS, f"asked for {wanted}, served by {served}"


@pytest.mark.needs("test-plugins")
def test_the_epp_is_told_the_endpoint_that_served(
    stack_factory: StackFactory, epp_command: EppCommand | None
) -> None:
    envoy = EnvoyOptions(follow_pool_endpoints=True, response_header_mode="SEND", report_served_endpoint=True)
    stack, endpoints = stack_with_test_plugins(stack_factory, epp_command, envoy)
    with httpx2.Client(base_url=stack.base_url, timeout=60) as http:
        for wanted in endpoints:
            check = functools.partial(served_as_asked, stack, http, wanted, echoed=True)
            eventually(check, timeout=60, message=f"the EPP echoes {wanted} as the endpoint that served")
