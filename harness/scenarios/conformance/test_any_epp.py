"""Scenarios for any EPP (``--epp-command``, ``harness conformance``): driven through Envoy, the API
server and the simulators' admin ports only, judged by what reaches which pod.

Where we depart from upstream on purpose, or upstream v0.3.0 has a known bug, the test says so with a
marker (`harness.verdicts.departures`), so the conformance report can tell "differs by design" from "fails".
Each test has its own Stack: they change pods and the pool.
"""

from __future__ import annotations

import httpx2
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, ModelSpec, Stack
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import cluster_of, endpoint, served_by
from harness.verdicts.traffic_oracle import TrafficVerdict

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic]

# Critical and served as the base model: never shed while a pod exists; no LoRA affinity.
MODEL = "base"
MODELS = (ModelSpec(MODEL, MODEL, "Critical", ((BASE_MODEL, None),)),)
BUSY_QUEUE, BUSY_KV = 50, 0.7  # busy, yet under every threshold that sheds Critical traffic
PRE_STOP_S = 120  # the terminating pod stays Ready (and serving) for the whole test


def complete(stack: Stack, model: str = MODEL) -> httpx2.Response:
    with httpx2.Client(base_url=stack.base_url, timeout=60) as http:
        body = {"model": model, "prompt": "hello", "max_tokens": 1}
        return http.post("/completions", json=body, headers=cluster_of(stack).objective_headers(model))


def with_a_terminating_pod(stack_factory: StackFactory) -> tuple[Stack, TrafficVerdict]:
    """Two pods and "leaving", routed to, then deleted: its preStop hook keeps it Ready and serving.
    Returns once a round of traffic reaches exactly the API server's members, i.e. not "leaving"."""
    stack = stack_factory(pods=2, models=MODELS)
    cluster = cluster_of(stack)
    assert stack.traffic is not None
    cluster.add_pod("leaving", pre_stop=PRE_STOP_S)
    stack.traffic.eventually_routes_to(sorted(cluster.pods))

    cluster.terminate_pod("leaving")
    return stack, stack.traffic.eventually_routes_to()


def test_a_terminating_pod_gets_no_traffic(stack_factory: StackFactory) -> None:
    """A pod with a deletionTimestamp is out of the pool even while its preStop hook keeps it Ready and
    serving (epp-behaviour.md §2.2; upstream #713 re-added such pods on resync)."""
    stack, verdict = with_a_terminating_pod(stack_factory)

    assert "leaving" not in verdict.expected, "the pod was not terminating when the check passed"
    assert cluster_of(stack).sim("leaving").info()["healthy"], "the terminating pod must still serve"


@pytest.mark.upstream_bug("713-resync-adds-deleting-pods")
def test_a_pool_change_does_not_bring_back_a_terminating_pod(stack_factory: StackFactory) -> None:
    """Changing the pool resyncs its pods (a selector change); a terminating pod stays out."""
    stack, _ = with_a_terminating_pod(stack_factory)
    cluster = cluster_of(stack)
    assert stack.traffic is not None

    # One more selector key, which every pod gets but one: the EPP re-lists the pool's pods. The pod
    # left out stops getting traffic only once the EPP has applied the change, so the round that
    # passes below comes after the re-list (a round before it would still reach that pod).
    dropped = sorted(name for name in cluster.pods if name != "leaving")[0]
    for name in cluster.pods:
        if name != dropped:
            cluster.pod_labels(name, {"tier": "gpu"})
    cluster.apply_pool(selector={**cluster_selector(stack), "tier": "gpu"})
    verdict = stack.traffic.eventually_routes_to()

    assert dropped not in verdict.expected, "the pool change did not leave the unlabelled pod out"
    assert "leaving" not in verdict.expected


def cluster_selector(stack: Stack) -> dict[str, str]:
    return cluster_of(stack).pool_selector()


@pytest.mark.departure("bodyless-routing")
def test_get_models_is_answered_by_a_pool_pod(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2, models=MODELS)
    pods = {endpoint(stack, name) for name in cluster_of(stack).pods}
    with httpx2.Client(base_url=stack.base_url, timeout=60) as http:
        response = http.get("/models")

    assert response.status_code == 200, f"GET /v1/models -> {response.status_code} {response.text!r}"
    assert served_by(response.headers) in pods
    assert BASE_MODEL in {m["id"] for m in response.json()["data"]}


@pytest.mark.departure("models-relisted-after-pool-recreation")
def test_models_are_served_again_after_the_pool_is_recreated(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2, models=MODELS)
    cluster = cluster_of(stack)
    assert stack.traffic is not None
    cluster.delete_pool()

    def refused() -> None:
        status = complete(stack).status_code
        assert status != 200, "still served without a pool"

    eventually(refused, timeout=30, message="the EPP stops routing once the pool is gone")
    cluster.apply_pool()

    def served() -> None:
        response = complete(stack)
        assert response.status_code == 200, f"{MODEL}: {response.status_code} {response.text!r}"

    eventually(served, timeout=30, message=f"{MODEL} served again after the pool was re-created")
    stack.traffic.eventually_routes_to(sorted(cluster.pods))


@pytest.mark.departure("staleness")
@pytest.mark.needs("load-aware-picking")
def test_a_pod_whose_metrics_went_stale_never_wins_over_a_fresh_one(stack_factory: StackFactory) -> None:
    """The fresh pod reports a long queue; the other stops answering scrapes while looking idle. Its
    idle numbers are old news (upstream #336): all traffic goes to the fresh pod, which can be seen."""
    stack = stack_factory(pods=2, models=MODELS)
    cluster = cluster_of(stack)
    assert stack.traffic is not None
    fresh, stale = sorted(cluster.pods)
    cluster.set_gauges(fresh, waiting=BUSY_QUEUE, kv_cache=BUSY_KV)
    cluster.sim(stale).black_hole(["/metrics"])

    verdict = stack.traffic.eventually_routes_to([fresh], timeout=45)

    assert verdict.received.get(stale, 0) == 0
    assert cluster.sim(stale).info()["healthy"], "the stale pod still serves: only its metrics stopped"


# ------------------------------------------------------------------------------------ metrics


def request_errors(stack: Stack, model: str) -> float:
    """``inference_model_request_error_total`` (v1: ``inference_objective_...``) summed over the
    samples of ``model``."""
    total = 0.0
    name = f"{cluster_of(stack).generation.request_metrics}_request_error_total{{"
    for line in stack.epp_metrics_text().splitlines():
        if line.startswith(name) and f'model_name="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.upstream_bug("request-error-total-never-incremented")
@pytest.mark.needs("request-metrics")
def test_a_failed_request_is_counted_as_a_request_error(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=1, models=MODELS)
    cluster = cluster_of(stack)
    assert stack.traffic is not None
    [pod] = cluster.pods
    cluster.pod_unready(pod)
    stack.traffic.eventually_routes_to([])  # every request now fails inside the EPP

    failed = complete(stack)
    assert failed.status_code != 200

    def counted() -> None:
        assert request_errors(stack, MODEL) >= 1, "no request_error_total sample"

    eventually(counted, timeout=30, message="the failed request counted in the request_error_total metric")
