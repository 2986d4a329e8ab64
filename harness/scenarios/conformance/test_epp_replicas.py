"""Two replicas of the EPP under test behind one Envoy that health-checks them, as a Deployment with
``replicas: 2`` looks to a gateway (`harness.beds.epp_replicas.EppReplicas`, any EPP command):

* leader failover under ``--ha-enable-leader-election`` (upstream #1264, PR #1337, and its e2e
  "failover after leader deleted"): only the Lease holder is SERVING; when its pod goes (SIGTERM,
  as a kubelet stops a deleted pod) the other replica takes over and requests are served again;
* an EPP drained with streams in flight (upstream #548): SIGTERM while requests it routed are still
  streaming their responses; they finish whole, and new requests go to the other replica.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import httpx2
import pytest

from harness.base.eventually import eventually
from harness.beds.epp_replicas import EppReplicas
from harness.beds.stack import BASE_MODEL, ModelSpec, Stack
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import CLIENT_TIMEOUT_S, cluster_of
from harness.sim import SimConfig

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic]

MODEL = "base"
MODELS = (ModelSpec(MODEL, MODEL, "Critical", ((BASE_MODEL, None),)),)
LEADER_ELECTION = "--ha-enable-leader-election"
# client-go's Lease timing (15 s) bounds a takeover when the leader does not hand the Lease over.
TAKEOVER_S = 40.0
SERVING, NOT_SERVING = "SERVING", "NOT_SERVING"


def complete(base_url: str, stack: Stack, max_tokens: int = 1) -> httpx2.Response:
    with httpx2.Client(base_url=base_url, timeout=CLIENT_TIMEOUT_S) as http:
        model = stack.model_for(MODEL)
        body = {"model": model, "prompt": "replica", "max_tokens": max_tokens}
        return http.post("/completions", json=body, headers=cluster_of(stack).objective_headers(model))


def running_requests(metrics_text: str) -> int:
    """``vllm:num_requests_running`` summed over its series, from a simulator's /metrics page."""
    series = [line for line in metrics_text.splitlines() if line.startswith("vllm:num_requests_running")]
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in series)


def health(replicas: EppReplicas) -> list[str]:
    """Each replica's gRPC health (the service of its dialect that says it serves the pool)."""
    states = []
    for replica in replicas.replicas:
        try:
            states.append(replica.health() if replica.running else "exited")
        except Exception as exc:  # a replica stopping refuses its health port
            states.append(type(exc).__name__)
    return states


@pytest.mark.needs("leader-election")
def test_only_the_leader_serves_and_the_next_replica_takes_over_when_it_goes(
    stack_factory: StackFactory,
) -> None:
    # The Stack's EPP starts alone, so it wins the Lease (the Stack waits for it to be SERVING).
    stack = stack_factory(pods=2, models=MODELS, epp_args=[LEADER_ELECTION])
    with EppReplicas(stack, 2, wait_serving=False) as replicas:
        leader = replicas.replicas[0]

        def served() -> None:
            response = complete(replicas.base_url, stack)
            assert response.status_code == 200, f"{response.status_code} {response.text!r}"

        eventually(served, timeout=30, message="requests through the replicas' Envoy are served")
        # The follower has listed the pool by now (it answers TLS, and a round of traffic went by);
        # it must still not say SERVING: one leader at a time.
        assert health(replicas) == [SERVING, NOT_SERVING], "only the Lease holder may be SERVING"

        leader.stop()  # its pod goes: SIGTERM, then SIGKILL after the grace period

        def taken_over() -> None:
            assert health(replicas)[1] == SERVING, f"replicas' health: {health(replicas)}"

        eventually(taken_over, timeout=TAKEOVER_S, message="the other replica takes the Lease over")
        eventually(served, timeout=30, message="requests are served again, through the new leader")


# Each long response streams for about 4 s: still going when its EPP is told to stop.
DRAIN_SIM = SimConfig(model=BASE_MODEL, max_num_seqs=16, time_scale=0.5)
LONG_TOKENS = 1300
IN_FLIGHT = 4


def test_a_drained_epp_lets_its_streams_finish_and_new_ones_go_to_the_other_replica(
    stack_factory: StackFactory,
) -> None:
    stack = stack_factory(pods=2, models=MODELS, sim_config=DRAIN_SIM)
    cluster = cluster_of(stack)
    with EppReplicas(stack, 2) as replicas, concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
        drained = replicas.replicas[0]
        # Through the Stack's own Envoy, whose only EPP is the one drained: every stream is its.
        assert stack.envoy is not None
        long = [
            pool.submit(complete, f"{stack.envoy.base_url}/v1", stack, LONG_TOKENS) for _ in range(IN_FLIGHT)
        ]

        def streaming() -> None:
            running = sum(running_requests(cluster.pods[name].metrics_text()) for name in cluster.pods)
            assert running == IN_FLIGHT, f"{running} of {IN_FLIGHT} long requests are being generated"

        eventually(streaming, timeout=30, message="the long requests are streaming")
        stopping = threading.Thread(target=drained.stop, name="drain-replica-0")
        stopping.start()
        try:
            fresh = []
            while stopping.is_alive():  # new requests while it drains: the other replica routes them
                fresh.append(complete(replicas.base_url, stack))
            answers = [f.result(timeout=CLIENT_TIMEOUT_S) for f in long]
        finally:
            stopping.join()

    assert [r.status_code for r in answers] == [200] * IN_FLIGHT, [r.text[:200] for r in answers]
    for response in answers:
        usage: dict[str, Any] = response.json().get("usage") or {}
        assert usage.get("completion_tokens") == LONG_TOKENS, f"cut short: {usage}"
    failed = [f"{r.status_code} {r.text[:120]!r}" for r in fresh if r.status_code != 200]
    assert not failed, f"{len(failed)} of {len(fresh)} requests sent during the drain failed: {failed[:3]}"
