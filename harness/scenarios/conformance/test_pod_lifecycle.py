"""Pods leave the pool the way they do in a cluster (their health fails and the node agent's readiness
probe marks them NotReady, or they are deleted gracefully) and traffic follows. Each test has its own
Stack: they change pods."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import openai
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, ModelSpec, Stack
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import (
    access_log_since,
    assert_readable_error,
    cluster_of,
    endpoint,
    openai_client,
    requests_by_model,
    served_by,
    settled_access_log,
    wait_routable,
)

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic]

# The base model, Critical: never shed while a pod exists, and with no LoRA traffic the EPP spreads it
# over every pod. (A LoRA model would stick to the first pod that served it: a pod that has never
# reported an adapter reports no max_lora either, so it never counts as able to load one.)
MODEL = "base"
MODELS = (ModelSpec(MODEL, MODEL, "Critical", ((BASE_MODEL, None),)),)
REQUESTS_AFTER_REMOVAL = 20


def send(client: openai.OpenAI, model: str) -> str:
    """One request; the ``ip:port`` of the simulator that answered it.

    Each prompt is new: a picker with prefix-cache affinity (llm-d-router's default) rightly keeps a
    repeated prompt on the pod that has it cached, and whether both pods are members is the
    question here, not whether the EPP spreads one prompt."""
    prompt = f"lifecycle {uuid.uuid4().hex}"
    raw = client.completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=1)
    return served_by(raw.headers)


def not_ready(stack: Stack, pod: str) -> None:
    cluster_of(stack).pod_unready(pod)


def deleted(stack: Stack, pod: str) -> None:
    cluster_of(stack).delete_pod(pod)


@pytest.mark.parametrize(
    "remove",
    [pytest.param(not_ready, id="made-not-ready"), pytest.param(deleted, id="deleted")],
)
def test_removed_pod_stops_receiving_traffic(
    stack_factory: StackFactory, remove: Callable[[Stack, str], None]
) -> None:
    stack = stack_factory(pods=2, models=MODELS)
    gone, kept = sorted(cluster_of(stack).pods)
    gone_at, kept_at = endpoint(stack, gone), endpoint(stack, kept)
    with openai_client(stack) as client:
        seen: set[str] = set()

        def both_pods_serve() -> None:
            seen.add(send(client, stack.model_for(MODEL)))
            assert seen == {gone_at, kept_at}, f"served so far by {sorted(seen)}"

        eventually(both_pods_serve, message="both pods take traffic before one leaves")
        remove(stack, gone)
        wait_routable(stack, [kept])
        gone_counts = requests_by_model(stack).get(gone)
        log_start = len(settled_access_log(stack))

        answered = [send(client, stack.model_for(MODEL)) for _ in range(REQUESTS_AFTER_REMOVAL)]

    assert answered == [kept_at] * REQUESTS_AFTER_REMOVAL
    entries = access_log_since(stack, log_start)
    assert [e["upstream_host"] for e in entries] == [kept_at] * REQUESTS_AFTER_REMOVAL
    if gone_counts is not None:  # a NotReady pod's simulator still runs: it saw nothing more
        assert requests_by_model(stack)[gone] == gone_counts


@pytest.mark.departure("503-no-endpoints")
def test_no_ready_pod_is_503_until_one_is_ready_again(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2, models=MODELS)
    pods = sorted(cluster_of(stack).pods)
    for pod in pods:
        cluster_of(stack).pod_unready(pod)
    wait_routable(stack, [])
    with openai_client(stack) as client:
        with pytest.raises(openai.InternalServerError) as caught:
            send(client, stack.model_for(MODEL))
        assert caught.value.status_code == 503
        assert_readable_error(caught.value, "no ready endpoints in InferencePool vllm-pool")

        cluster_of(stack).pod_ready(pods[0])
        wait_routable(stack, pods[:1])
        assert send(client, stack.model_for(MODEL)) == endpoint(stack, pods[0])
