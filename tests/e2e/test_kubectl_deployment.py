"""A Deployment applied with kubectl, like a user: the node agent runs it, the EPP routes to it.

The Stack here applies nothing itself (no pool, no models, no pods): its EPP and Envoy serve the pool
of ``examples/cluster/vllm-sim.yaml`` (on v1 CRDs ``vllm-sim-v1.yaml``: the same Deployment, an
InferencePool v1, a rewrite and objectives), and the test does only what a user does — ``kubectl apply``,
``kubectl scale``, ``kubectl delete pod`` — and sends requests through Envoy. Between those commands
nothing else touches the cluster: the Deployment controller makes the pods, the scheduler binds them,
the node agent runs and probes them, the EPP watches them.

Each replica keeps serving for 5 s after its deletion (a preStop sleep, as drained vLLM Deployments
do), so "the EPP stops routing to a removed pod before it is gone from the API" is observable: the
pod is still there, Ready, with a deletionTimestamp, when the EPP has already dropped it.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest
from kubernetes import client, watch

from harness.base.eventually import eventually
from harness.beds.stack import Stack
from harness.cluster.kubectl import kubectl as run_kubectl
from harness.cluster.pod_status import is_ready
from harness.cluster.releases import session_generation
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import openai_client, served_by

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
POOL = "vllm-llama3-8b-instruct"
BASE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
REPLICAS = 4
TIMEOUT_S = 90.0
# What a client may see while the Deployment comes up: the model not known yet (404), no ready pod
# yet (503).
STARTING = (openai.NotFoundError, openai.InternalServerError)


def kubectl(stack: Stack, *args: str) -> str:
    return run_kubectl(stack.access.kubeconfig_path, *args, namespace=stack.options.namespace)


def pods(stack: Stack) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl(stack, "get", "pods", "-o", "json"))["items"]
    return items


def send(client_: openai.OpenAI) -> str:
    """One request for the base model with a prompt of its own (no prefix affinity); who served it."""
    raw = client_.completions.with_raw_response.create(
        model=BASE_MODEL, prompt=f"request {secrets.token_hex(8)}", max_tokens=1
    )
    return served_by(raw.headers)


@pytest.fixture
def deployed(stack_factory: StackFactory) -> Stack:
    stack = stack_factory(pool_name=POOL, apply_pool=False)
    kubectl(stack, "apply", "-f", str(REPO / session_generation().example_manifest))
    return stack


def test_the_examples_weighted_model_is_split_across_its_two_adapters(deployed: Stack) -> None:
    """food-review: 70/30 over two LoRA adapters (an InferenceModel's targets, or v1's rewrite)."""
    with openai_client(deployed) as client_:

        def routable() -> str:
            return str(client_.completions.create(model="food-review", prompt="hi", max_tokens=1).model)

        eventually(routable, timeout=TIMEOUT_S, retry_on=STARTING, message="food-review is served")
        served = Counter(routable() for _ in range(40))  # both adapters: all but certain (0.7**40)
    assert set(served) == {"food-review-1", "food-review-2"}, served


def test_applied_deployment_is_reached_through_envoy_and_scaling_down_drains_before_the_pods_go(
    deployed: Stack,
) -> None:
    stack = deployed
    with openai_client(stack) as client_:
        seen: set[str] = set()

        def every_replica_served() -> None:
            seen.add(send(client_))
            assert len(seen) == REPLICAS, f"served so far by {sorted(seen)}"

        eventually(every_replica_served, timeout=TIMEOUT_S, retry_on=STARTING, message="all replicas serve")
        addresses = {p["status"]["podIP"]: p["metadata"]["name"] for p in pods(stack)}
        assert {a.rsplit(":", 1)[0] for a in seen} == set(addresses), (
            "served by exactly the Deployment's pods"
        )

        kubectl(stack, "scale", f"deployment/{POOL}", "--replicas=1")

        def epp_holds_one() -> list[str]:
            held = [p["name"] for p in stack.datastore_view()["pods"]]
            assert len(held) == 1, f"the EPP still holds {held}"
            return held

        [survivor] = eventually(epp_holds_one, timeout=TIMEOUT_S, message="the EPP dropped the removed pods")
        # Dropped at their deletionTimestamp: in the API they are still there, Ready, draining.
        leaving = [p for p in pods(stack) if p["metadata"]["name"] != survivor]
        assert len(leaving) == REPLICAS - 1, [p["metadata"]["name"] for p in leaving]
        for pod in leaving:
            assert pod["metadata"].get("deletionTimestamp"), pod["metadata"]
            assert is_ready(pod), f"{pod['metadata']['name']} left Ready before its preStop hook ended"

        newest = max(int(p["metadata"]["resourceVersion"]) for p in leaving)
        stack.settled(at={"pods": newest})  # the EPP has applied every deletionTimestamp
        survivor_ip = next(ip for ip, name in addresses.items() if name == survivor)
        answered = [send(client_) for _ in range(10)]
        assert {a.rsplit(":", 1)[0] for a in answered} == {survivor_ip}, answered


def test_deleted_pod_shows_terminating_then_not_ready_before_it_disappears(deployed: Stack) -> None:
    stack = deployed

    def all_ready() -> list[dict[str, Any]]:
        listed = pods(stack)
        assert len(listed) == REPLICAS, f"{len(listed)} replicas"
        assert all(is_ready(p) for p in listed), "not all replicas Ready yet"
        return listed

    victim = eventually(all_ready, timeout=TIMEOUT_S, message="the Deployment is up")[0]
    name = victim["metadata"]["name"]
    events = _Watch(stack, name, victim["metadata"]["resourceVersion"])

    kubectl(stack, "delete", "pod", name, "--wait=false")
    assert "Terminating" in kubectl(stack, "get", "pod", name), "kubectl shows it Terminating (preStop)"

    seen = events.until_deleted()
    states = [(e["type"], bool(e["object"]["metadata"].get("deletionTimestamp")), is_ready(e["object"]))
              for e in seen]  # fmt: skip
    terminating = [s for s in states if s[0] == "MODIFIED" and s[1]]
    assert terminating[0][2], f"the deletion starts with the pod as it was, Ready: {states}"
    assert any(not ready for _, _, ready in terminating), f"Ready=False before it went: {states}"
    assert states[-1][0] == "DELETED", states
    # The order a kubelet keeps: SIGTERM and Ready=False first, while the container still runs; then
    # its terminated state; then the delete.
    stopping = [
        next(iter(e["object"]["status"]["containerStatuses"][0]["state"]))
        for e in seen
        if e["type"] == "MODIFIED"
        and e["object"]["metadata"].get("deletionTimestamp")
        and not is_ready(e["object"])
    ]
    assert stopping[0] == "running", f"Ready=False written after SIGTERM, before the exit: {stopping}"
    assert stopping[-1] == "terminated", stopping
    last_status = seen[-1]["object"]["status"]
    assert last_status["phase"] in ("Succeeded", "Failed"), last_status
    assert "terminated" in last_status["containerStatuses"][0]["state"], last_status


class _Watch:
    """Every event of one pod from a revision on, read until its DELETED event."""

    def __init__(self, stack: Stack, name: str, since: str) -> None:
        self._stack, self._name, self._since = stack, name, since

    def until_deleted(self) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []
        with self._stack.access.api_client() as api:
            stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                client.CoreV1Api(api).list_namespaced_pod,
                self._stack.options.namespace,
                field_selector=f"metadata.name={self._name}",
                resource_version=self._since,
                timeout_seconds=int(TIMEOUT_S),
                _preload_content=False,
            )
            for event in stream:
                raw = event["raw_object"]
                seen.append({"type": event["type"], "object": raw})
                if event["type"] == "DELETED":
                    break
        assert seen, f"no event within {TIMEOUT_S}s"
        assert seen[-1]["type"] == "DELETED", f"not deleted within {TIMEOUT_S}s: {seen}"
        return seen
