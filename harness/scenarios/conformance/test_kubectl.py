"""What an operator does with kubectl takes effect on the data path, as seen through Envoy.

The EPP only watches the API server; kubectl is just another client of it. So a model applied with
`kubectl apply` becomes routable, `kubectl delete` makes it a 404, and `kubectl label` taking a pod
out of the pool's selector stops its traffic: all observed with the openai SDK through Envoy. The
model is written once and applied in the cluster's generation (v1: an InferenceModelRewrite and an
InferenceObjective); there an undeclared model passes the EPP as named, and the 404 is the model
server's, which serves no such model.

Positive outcomes are polled with `eventually`, naming the error a request legitimately gets while
the EPP catches up (a 404 before the model is applied). The negative one ("the pod gets no more
traffic") is checked once, after settling on the resourceVersion kubectl's write made.
"""

from __future__ import annotations

from collections import Counter

import openai
import pytest
import yaml

from harness.base.eventually import eventually
from harness.beds.stack import Stack
from harness.cluster.builders import ModelBuilder
from harness.cluster.kubectl import kubectl as run_kubectl
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import (
    cluster_of,
    endpoint,
    error_text,
    openai_client,
    served_by,
    wait_routable,
)

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic]

MODEL = "kubectl-model"
ADAPTER = "food-review-1"


def kubectl(stack: Stack, *args: str, stdin: str | None = None) -> str:
    return run_kubectl(stack.access.kubeconfig_path, *args, namespace=stack.options.namespace, stdin=stdin)


def served_model(stack: Stack) -> ModelBuilder:
    """The model the operator applies, described once (an InferenceModel, or v1's rewrite and objective)."""
    return (
        ModelBuilder(MODEL)
        .model_name(MODEL)
        .criticality("Critical")
        .pool(stack.options.pool_name)
        .target(ADAPTER)
    )


def manifest(stack: Stack) -> str:
    """What the operator writes: the model's objects for the cluster's generation, as YAML."""
    bodies = []
    for _, body in served_model(stack).objects(cluster_of(stack).generation):
        del body["metadata"]["namespace"]  # kubectl's -n says it, as in a user's manifest
        bodies.append(body)
    return yaml.safe_dump_all(bodies, sort_keys=False)


def plural_names(stack: Stack) -> list[str]:
    """The kinds ``kubectl get`` / ``delete`` name for the model (``inferencemodel`` or v1's two)."""
    return [kind.lower() for kind in cluster_of(stack).generation.model_kinds]


@pytest.mark.departure("readable-error-bodies")
@pytest.mark.needs("model-aware-routing")
def test_model_applied_with_kubectl_is_served_and_deleting_it_gives_404(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2)
    with openai_client(stack) as client:
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=MODEL, prompt="hi", max_tokens=1)

        assert "created" in kubectl(stack, "apply", "-f", "-", stdin=manifest(stack))
        for kind in plural_names(stack):
            listed = kubectl(stack, "get", kind)
            assert MODEL in listed
            assert ADAPTER not in listed, "printer columns show the pool, not targets"

        def served() -> str:
            reply = client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
            return reply.model

        # 404 until the EPP has the model: the one error this wait may see.
        routable = eventually(
            served, retry_on=(openai.NotFoundError,), message="the kubectl-applied model is routable"
        )
        assert routable == ADAPTER

        kubectl(stack, "delete", ",".join(plural_names(stack)), MODEL)

        def gone() -> openai.NotFoundError:
            try:
                reply = client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
            except openai.NotFoundError as err:
                return err
            raise AssertionError(f"the deleted model is still served (as {reply.model})")

        assert MODEL in error_text(eventually(gone, message="the deleted model answers 404"))


def test_pod_labelled_out_of_the_pool_with_kubectl_stops_getting_traffic(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2)
    leaving, staying = sorted(cluster_of(stack).pods)
    address_to_pod = {endpoint(stack, name): name for name in (leaving, staying)}

    written = kubectl(stack, "label", "pod", leaving, "app-", "-o", "jsonpath={.metadata.resourceVersion}")
    if stack.white_box:
        stack.settled(at={"pods": written})  # the EPP has applied the label change: no polling below
    else:  # an EPP without a datastore view: until traffic shows the label change applied
        wait_routable(stack, [staying])

    asked = stack.model_for("food-review")  # the pods' base model for an EPP that rewrites no name
    with openai_client(stack) as client:
        landed = Counter(
            address_to_pod[served_by(raw.headers)]
            for raw in (
                client.completions.with_raw_response.create(model=asked, prompt="hi", max_tokens=1)
                for _ in range(20)
            )
        )
    assert landed == {staying: 20}, f"{leaving} still receives traffic: requests per pod {dict(landed)}"
    pods = kubectl(stack, "get", "pods", "-L", "app")
    assert leaving in pods
