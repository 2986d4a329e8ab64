"""harness.cluster.builders: the API-JSON shapes they produce, and that the EPP's parsers read them."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pytest

from epp.api import v1alpha2
from epp.api.types import (
    V1ALPHA2_GROUP,
    Criticality,
    NamespacedName,
    PodObject,
    PoolRef,
    RewriteRule,
    TargetModel,
)
from harness.cluster import releases
from harness.cluster.builders import (
    HOLD_FINALIZER,
    STAND_IN_SCHEDULER,
    ModelBuilder,
    PodBuilder,
    PoolBuilder,
    rfc3339,
)
from harness.cluster.releases import V1

T0 = datetime(2025, 3, 13, 12, 0, 5, 999_000, tzinfo=UTC)


def test_pod_without_status_is_a_minimal_valid_pod() -> None:
    pod = PodBuilder("p1").build()

    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "default"},
        "spec": {"schedulerName": STAND_IN_SCHEDULER, "containers": [{"name": "sim", "image": "sim"}]},
    }


def test_ready_pod_carries_ip_phase_and_ready_conditions() -> None:
    builder = PodBuilder("p1").namespace("ns").labels(app="x").ready("127.0.0.5", at=T0)

    pod = builder.build()

    status = pod["status"]
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.0.0.5"
    assert status["podIPs"] == [{"ip": "127.0.0.5"}]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"] == {
        "type": "Ready",
        "status": "True",
        "lastTransitionTime": "2025-03-13T12:00:05Z",
    }
    assert conditions["ContainersReady"]["status"] == "True"
    assert status["containerStatuses"][0]["ready"] is True
    assert builder.ip == "127.0.0.5"
    assert builder.is_ready
    assert builder.status_dict() == status


def test_unready_pod_keeps_its_ip() -> None:
    builder = PodBuilder("p1").unready("127.0.0.5")

    status = builder.build()["status"]

    assert status["podIP"] == "127.0.0.5"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"
    assert not builder.is_ready


def test_deleting_pod_has_deletion_timestamp_held_by_a_finalizer() -> None:
    pod = PodBuilder("p1").ready("127.0.0.5").deleting(at=T0).build()

    assert pod["metadata"]["deletionTimestamp"] == "2025-03-13T12:00:05Z"
    assert pod["metadata"]["finalizers"] == [HOLD_FINALIZER]


def test_deleting_keeps_existing_finalizers_only() -> None:
    pod = PodBuilder("p1").finalizers("example.com/x").deleting(at=T0).build()

    assert pod["metadata"]["finalizers"] == ["example.com/x"]


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        pytest.param(datetime(2025, 1, 2, 3, 4, 5), "2025-01-02T03:04:05Z", id="naive-is-utc"),
        pytest.param(
            datetime(2025, 1, 2, 3, 4, 5, 600_000, tzinfo=UTC), "2025-01-02T03:04:05Z", id="seconds-only"
        ),
        pytest.param(
            datetime(2025, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2))),
            "2025-01-02T03:04:05Z",
            id="converted-to-utc",
        ),
    ],
)
def test_rfc3339(moment: datetime, text: str) -> None:
    assert rfc3339(moment) == text


def test_labels_accept_mapping_and_keywords_and_accumulate() -> None:
    pod = PodBuilder("p1").labels({"app.kubernetes.io/name": "vllm"}, tier="a").labels(labels="x").build()

    assert pod["metadata"]["labels"] == {"app.kubernetes.io/name": "vllm", "tier": "a", "labels": "x"}


def test_build_returns_independent_copies() -> None:
    builder = ModelBuilder("m").model_name("llama").pool("pool").target("a", weight=1)

    first = builder.build()
    first["spec"]["targetModels"].append({"name": "b"})
    first["metadata"]["name"] = "changed"

    assert builder.build()["spec"]["targetModels"] == [{"name": "a", "weight": 1}]
    assert builder.build()["metadata"]["name"] == "m"


def test_pool_builder_emits_only_what_was_set() -> None:
    assert PoolBuilder("pool").build() == {
        "apiVersion": releases.V1ALPHA2.pool_api_version,
        "kind": "InferencePool",
        "metadata": {"name": "pool", "namespace": "default"},
        "spec": {},
    }
    full = PoolBuilder("pool").namespace("ns").selector(app="x").port(8000)
    full.extension_ref("epp", port=9002, failure_mode="FailOpen", kind="Service", group="")
    assert full.build()["spec"] == {
        "selector": {"app": "x"},
        "targetPortNumber": 8000,
        "extensionRef": {
            "name": "epp",
            "group": "",
            "kind": "Service",
            "portNumber": 9002,
            "failureMode": "FailOpen",
        },
    }


def test_model_builder_shape() -> None:
    model = (
        ModelBuilder("m")
        .namespace("ns")
        .model_name("llama")
        .criticality("Critical")
        .pool("pool")
        .target("lora-a", weight=50)
        .target("lora-b", weight=50)
        .created_at(T0)
        .build()
    )

    assert model["metadata"] == {"name": "m", "namespace": "ns", "creationTimestamp": "2025-03-13T12:00:05Z"}
    assert model["spec"] == {
        "modelName": "llama",
        "criticality": "Critical",
        "poolRef": {"name": "pool"},
        "targetModels": [{"name": "lora-a", "weight": 50}, {"name": "lora-b", "weight": 50}],
    }


def test_epp_parses_builder_objects() -> None:
    pool = v1alpha2.pool_from_api(PoolBuilder("pool").namespace("ns").selector(app="x").port(8000).build())
    model = v1alpha2.model_from_api(
        ModelBuilder("m").namespace("ns").model_name("llama").criticality("Sheddable").pool("pool")
        .target("lora-a", weight=3).created_at(T0).build()
    )  # fmt: skip
    pod = PodObject.from_api(
        PodBuilder("p1").namespace("ns").labels(app="x").ready("127.0.0.5").deleting().build()
    )

    assert pool.key == NamespacedName("ns", "pool")
    assert pool.target_port == 8000
    assert pool.matches({"app": "x"})
    assert model.rules == (RewriteRule(("llama",), (TargetModel("lora-a", 3),)),)
    assert model.pool_ref == PoolRef(V1ALPHA2_GROUP, "pool")
    assert model.objective is not None
    assert model.objective.criticality is Criticality.SHEDDABLE
    assert model.objective.sheddable
    assert model.created == T0.replace(microsecond=0)
    assert pod.pod_ip == "127.0.0.5"
    assert pod.ready
    assert pod.deleting
    assert not pod.routable


def test_builders_do_not_import_the_kubernetes_client() -> None:
    code = (
        "import sys, harness.cluster.builders; "
        "sys.exit(any(m.split('.')[0] == 'kubernetes' for m in sys.modules))"
    )

    result = subprocess.run([sys.executable, "-c", code], check=False, timeout=60)

    assert result.returncode == 0, "harness.cluster.builders must stay free of kubernetes-client imports"


def test_one_pool_description_renders_for_each_generation() -> None:
    pool = PoolBuilder("pool").namespace("ns").selector(app="x").ports(8000, 8001).extension_ref("epp")
    assert pool.build()["spec"] == {
        "selector": {"app": "x"},
        "targetPortNumber": 8000,
        "extensionRef": {"name": "epp"},
    }
    v1 = pool.app_protocol("kubernetes.io/h2c").build(V1)
    assert v1["apiVersion"] == releases.V1.pool_api_version
    assert v1["spec"] == {
        "selector": {"matchLabels": {"app": "x"}},
        "targetPorts": [{"number": 8000}, {"number": 8001}],
        "appProtocol": "kubernetes.io/h2c",
        "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
    }


@pytest.mark.parametrize(
    ("criticality", "priority"),
    [("Critical", 1), ("Standard", -1), (None, -1), ("Sheddable", -2)],
    ids=["critical", "standard", "unset", "sheddable"],
)
def test_a_served_model_in_v1_is_a_rewrite_and_an_objective(criticality: str | None, priority: int) -> None:
    model = ModelBuilder("m").namespace("ns").model_name("llama").pool("pool").target("a", weight=30)
    if criticality is not None:
        model = model.criticality(criticality)
    [(rewrite_kind, rewrite), (objective_kind, objective)] = model.target("b", weight=70).objects(V1)
    assert (rewrite_kind, objective_kind) == ("InferenceModelRewrite", "InferenceObjective")
    pool_ref = {"name": "pool", "group": releases.V1.pool_group}
    assert rewrite["spec"] == {
        "poolRef": pool_ref,
        "rules": [
            {
                "matches": [{"model": {"type": "Exact", "value": "llama"}}],
                "targets": [{"modelRewrite": "a", "weight": 30}, {"modelRewrite": "b", "weight": 70}],
            }
        ],
    }
    assert objective["spec"] == {"poolRef": pool_ref, "priority": priority}
    assert rewrite["metadata"]["name"] == objective["metadata"]["name"] == "m"


def test_a_model_without_targets_rewrites_to_itself_in_v1() -> None:
    """A rewrite needs one target (minItems 1): the model served as it is named."""
    rewrite = ModelBuilder("m").model_name("llama").pool("pool").rewrite()
    assert rewrite["spec"]["rules"][0]["targets"] == [{"modelRewrite": "llama"}]
