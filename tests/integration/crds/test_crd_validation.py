"""The upstream CRDs, as served by the real API server: every invalid object is rejected with the
expected message, valid ones are accepted with the CRD defaults applied (reference/epp-behaviour.md
§1). Only upstream's own rules are checked here: ranges, patterns, required fields, the CEL weight
rule and the immutable ``modelName``; what upstream does not validate (selector keys) is accepted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from harness.cluster.builders import ModelBuilder, PoolBuilder
from harness.cluster.kube import CustomResourceClient, Kube, api_error_message
from harness.cluster.releases import V1ALPHA2

# v0.3.0's CRD schema and kinds (InferenceModel): not applicable on v1 CRDs.
pytestmark = [pytest.mark.integration, pytest.mark.api_generation("v1alpha2")]

JsonObject = dict[str, Any]

# A DNS subdomain of 189 characters (labels of at most 63): with "/" and a 63-character name, a
# label key of exactly 253 characters.
LABEL_PREFIX_189 = ".".join(["a" * 63, "b" * 63, "c" * 61])
# A DNS subdomain of 246 characters: a valid label-key prefix (at most 253), so "<prefix>/app" is a
# valid label key that upstream's CRD accepts (a stricter copy once rejected it).
LABEL_PREFIX_246 = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 54])


def pool() -> PoolBuilder:
    """A valid pool; each case breaks exactly one thing."""
    return PoolBuilder("pool").selector(app="model-server").port(8000).extension_ref("epp")


def model() -> ModelBuilder:
    """A valid model; each case breaks exactly one thing."""
    return ModelBuilder("model").model_name("llama").pool("pool")


def without(obj: JsonObject, *path: str | int) -> JsonObject:
    """``obj`` with the field at ``path`` removed (to leave out a required field)."""
    parent: Any = obj
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return obj


def targets(count: int, weight: int | None = None) -> ModelBuilder:
    builder = model()
    for i in range(count):
        builder.target(f"lora-{i}", weight=weight)
    return builder


@dataclass(frozen=True)
class Invalid:
    kind: str  # "pools" or "models"
    body: JsonObject
    fragment: str  # must appear in the server's message


@dataclass(frozen=True)
class InvalidUpdate:
    kind: str
    body: JsonObject  # valid, created first
    patch: JsonObject  # merge patch that must be rejected
    fragment: str


def _client(kube: Kube, kind: str) -> CustomResourceClient:
    return {"pools": kube.pools, "models": kube.models}[kind]


INVALID_CREATES = [
    # --- InferencePool
    pytest.param(
        Invalid(
            "pools",
            pool().port(0).build(),
            "spec.targetPortNumber in body should be greater than or equal to 1",
        ),
        id="pool-port-0",
    ),
    pytest.param(
        Invalid(
            "pools",
            pool().port(70000).build(),
            "spec.targetPortNumber in body should be less than or equal to 65535",
        ),
        id="pool-port-70000",
    ),
    pytest.param(
        Invalid("pools", pool().selector(app="-bad").build(), "spec.selector.app in body should match"),
        id="pool-selector-bad-label-value",
    ),
    pytest.param(
        Invalid(
            "pools",
            pool().selector(app="v" * 64).build(),
            "spec.selector.app: Too long: may not be more than 63",
        ),
        id="pool-selector-label-value-longer-than-63",
    ),
    pytest.param(
        Invalid("pools", without(pool().build(), "spec", "selector"), "spec.selector: Required value"),
        id="pool-missing-selector",
    ),
    pytest.param(
        Invalid(
            "pools",
            without(pool().build(), "spec", "targetPortNumber"),
            "spec.targetPortNumber: Required value",
        ),
        id="pool-missing-target-port",
    ),
    pytest.param(
        Invalid(
            "pools", without(pool().build(), "spec", "extensionRef"), "spec.extensionRef: Required value"
        ),
        id="pool-missing-extension-ref",
    ),
    pytest.param(
        Invalid(
            "pools",
            pool().extension_ref("").build(),
            "spec.extensionRef.name in body should be at least 1 chars long",
        ),
        id="pool-extension-ref-empty-name",
    ),
    pytest.param(
        Invalid(
            "pools",
            pool().extension_ref("epp", kind="1Service").build(),
            "spec.extensionRef.kind in body should match",
        ),
        id="pool-extension-ref-bad-kind",
    ),
    pytest.param(
        Invalid(
            "pools",
            pool().extension_ref("epp", group="Bad_Group").build(),
            "spec.extensionRef.group in body should match",
        ),
        id="pool-extension-ref-bad-group",
    ),
    pytest.param(
        Invalid(
            "pools",
            pool().extension_ref("epp", port=0).build(),
            "spec.extensionRef.portNumber in body should be greater than or equal to 1",
        ),
        id="pool-extension-ref-port-0",
    ),
    pytest.param(
        Invalid(
            "pools",
            pool().extension_ref("epp", failure_mode="FailSometimes").build(),
            'spec.extensionRef.failureMode: Unsupported value: "FailSometimes"',
        ),
        id="pool-extension-ref-unknown-failure-mode",
    ),
    # --- InferenceModel
    pytest.param(
        Invalid(
            "models",
            model().target("lora-a", weight=0).build(),
            "spec.targetModels[0].weight in body should be greater than or equal to 1",
        ),
        id="model-weight-0",
    ),
    pytest.param(
        Invalid(
            "models",
            model().target("lora-a", weight=1000001).build(),
            "spec.targetModels[0].weight in body should be less than or equal to 1000000",
        ),
        id="model-weight-1000001",
    ),
    pytest.param(
        Invalid(
            "models",
            model().target("lora-a", weight=50).target("lora-b").build(),
            "Weights should be set for all models, or none of the models.",
        ),
        id="model-weights-on-some-targets-only",
    ),
    pytest.param(
        Invalid("models", targets(11).build(), "spec.targetModels: Too many: 11: must have at most 10 items"),
        id="model-11-targets",
    ),
    pytest.param(
        Invalid(
            "models",
            model().target("t" * 254).build(),
            "spec.targetModels[0].name: Too long: may not be more than 253",
        ),
        id="model-target-name-longer-than-253",
    ),
    pytest.param(
        Invalid(
            "models",
            without(model().target("x").build(), "spec", "targetModels", 0, "name"),
            "spec.targetModels[0].name: Required value",
        ),
        id="model-target-without-name",
    ),
    pytest.param(
        Invalid(
            "models", model().criticality("Urgent").build(), 'spec.criticality: Unsupported value: "Urgent"'
        ),
        id="model-unknown-criticality",
    ),
    pytest.param(
        Invalid("models", without(model().build(), "spec", "poolRef"), "spec.poolRef: Required value"),
        id="model-missing-pool-ref",
    ),
    pytest.param(
        Invalid(
            "models", model().pool("").build(), "spec.poolRef.name in body should be at least 1 chars long"
        ),
        id="model-pool-ref-empty-name",
    ),
    pytest.param(
        Invalid(
            "models",
            model().pool("pool", kind="Inference Pool").build(),
            "spec.poolRef.kind in body should match",
        ),
        id="model-pool-ref-bad-kind",
    ),
    pytest.param(
        Invalid("models", without(model().build(), "spec", "modelName"), "spec.modelName: Required value"),
        id="model-missing-model-name",
    ),
    pytest.param(
        Invalid(
            "models",
            model().model_name("m" * 257).build(),
            "spec.modelName: Too long: may not be more than 256",
        ),
        id="model-model-name-longer-than-256",
    ),
]


@pytest.mark.parametrize("case", INVALID_CREATES)
def test_invalid_object_is_rejected(kube_api: ApiClient, namespace: str, case: Invalid) -> None:
    resource = _client(Kube(kube_api), case.kind)

    with pytest.raises(ApiException) as caught:
        resource.create(namespace, case.body)

    assert caught.value.status == 422, api_error_message(caught.value)
    assert case.fragment in api_error_message(caught.value)
    assert resource.list(namespace) == []


INVALID_UPDATES = [
    pytest.param(
        InvalidUpdate("models", model().build(), {"spec": {"modelName": "other"}}, "modelName is immutable"),
        id="model-model-name-changed",
    ),
    pytest.param(
        InvalidUpdate(
            "models",
            model().target("lora-a", weight=1).target("lora-b", weight=2).build(),
            {"spec": {"targetModels": [{"name": "lora-a", "weight": 1}, {"name": "lora-b"}]}},
            "Weights should be set for all models, or none of the models.",
        ),
        id="model-weight-removed-from-one-target",
    ),
    pytest.param(
        InvalidUpdate(
            "pools",
            pool().build(),
            {"spec": {"targetPortNumber": 70000}},
            "should be less than or equal to 65535",
        ),
        id="pool-port-changed-to-70000",
    ),
]


@pytest.mark.parametrize("case", INVALID_UPDATES)
def test_invalid_update_is_rejected(kube_api: ApiClient, namespace: str, case: InvalidUpdate) -> None:
    resource = _client(Kube(kube_api), case.kind)
    created = resource.create(namespace, case.body)
    name = created["metadata"]["name"]

    with pytest.raises(ApiException) as caught:
        resource.patch(namespace, name, case.patch)

    assert caught.value.status == 422, api_error_message(caught.value)
    assert case.fragment in api_error_message(caught.value)
    assert resource.get(namespace, name)["spec"] == created["spec"]


VALID = [
    pytest.param(
        "pools",
        pool().build(),
        {
            "selector": {"app": "model-server"},
            "targetPortNumber": 8000,
            "extensionRef": {"name": "epp", "group": "", "kind": "Service", "failureMode": "FailClose"},
        },
        id="pool-extension-ref-defaults",
    ),
    pytest.param(
        "pools",
        pool()
        .selector({"app.kubernetes.io/name": "vllm", "tier": "", "Model_Version.2": "v1.2-b_3"})
        .port(65535)
        .extension_ref("epp", group="", kind="Service", port=9002, failure_mode="FailOpen")
        .build(),
        {
            "selector": {"app.kubernetes.io/name": "vllm", "tier": "", "Model_Version.2": "v1.2-b_3"},
            "targetPortNumber": 65535,
            "extensionRef": {
                "name": "epp",
                "group": "",
                "kind": "Service",
                "portNumber": 9002,
                "failureMode": "FailOpen",
            },
        },
        id="pool-every-field-set",
    ),
    pytest.param(
        "pools",
        pool().selector({LABEL_PREFIX_189 + "/" + "b" * 63: "x"}).port(1).build(),
        {
            "selector": {LABEL_PREFIX_189 + "/" + "b" * 63: "x"},
            "targetPortNumber": 1,
            "extensionRef": {"name": "epp", "group": "", "kind": "Service", "failureMode": "FailClose"},
        },
        id="pool-label-key-of-253-and-port-1",
    ),
    pytest.param(
        "pools",
        pool().selector({LABEL_PREFIX_246 + "/app": "x"}).build(),
        {
            "selector": {LABEL_PREFIX_246 + "/app": "x"},
            "targetPortNumber": 8000,
            "extensionRef": {"name": "epp", "group": "", "kind": "Service", "failureMode": "FailClose"},
        },
        id="pool-selector-key-with-246-char-dns-prefix",
    ),
    pytest.param(
        "pools",
        pool().selector({"Bad_Prefix/app": "y", "app-": "z"}).build(),
        {
            "selector": {"Bad_Prefix/app": "y", "app-": "z"},
            "targetPortNumber": 8000,
            "extensionRef": {"name": "epp", "group": "", "kind": "Service", "failureMode": "FailClose"},
        },
        id="pool-selector-keys-are-not-validated-upstream",
    ),
    pytest.param(
        "models",
        model().build(),
        {
            "modelName": "llama",
            "poolRef": {"name": "pool", "group": V1ALPHA2.pool_group, "kind": "InferencePool"},
        },
        id="model-pool-ref-defaults-no-criticality-default",
    ),
    pytest.param(
        "models",
        targets(10, weight=1000000).criticality("Sheddable").model_name("m" * 256).build(),
        {
            "modelName": "m" * 256,
            "criticality": "Sheddable",
            "poolRef": {"name": "pool", "group": V1ALPHA2.pool_group, "kind": "InferencePool"},
            "targetModels": [{"name": f"lora-{i}", "weight": 1000000} for i in range(10)],
        },
        id="model-10-weighted-targets-longest-name",
    ),
    pytest.param(
        "models",
        model().criticality("Critical").target("lora-a").target("lora-b").build(),
        {
            "modelName": "llama",
            "criticality": "Critical",
            "poolRef": {"name": "pool", "group": V1ALPHA2.pool_group, "kind": "InferencePool"},
            "targetModels": [{"name": "lora-a"}, {"name": "lora-b"}],
        },
        id="model-targets-without-weights",
    ),
]


@pytest.mark.parametrize(("kind", "body", "expected_spec"), VALID)
def test_valid_object_is_accepted_with_defaults(
    kube_api: ApiClient, namespace: str, kind: str, body: JsonObject, expected_spec: JsonObject
) -> None:
    resource = _client(Kube(kube_api), kind)

    created = resource.create(namespace, body)

    assert created["spec"] == expected_spec
    assert resource.get(namespace, body["metadata"]["name"])["spec"] == expected_spec


def test_model_update_keeping_model_name_is_accepted(kube_api: ApiClient, namespace: str) -> None:
    kube = Kube(kube_api)
    kube.models.create(namespace, model().criticality("Standard").build())

    updated = kube.models.patch(
        namespace,
        "model",
        {"spec": {"criticality": "Sheddable", "targetModels": [{"name": "lora-a", "weight": 3}]}},
    )

    assert updated["spec"]["modelName"] == "llama"
    assert updated["spec"]["criticality"] == "Sheddable"
    assert updated["spec"]["targetModels"] == [{"name": "lora-a", "weight": 3}]
