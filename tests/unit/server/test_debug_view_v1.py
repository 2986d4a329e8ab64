"""The debug view over a datastore filled from the v1 generation: one entry per endpoint (pod and port),
the pool's v1 fields, objectives, rewrites, and `models` as the exact-match winners."""

from __future__ import annotations

from epp.api import v1
from epp.api.types import PodObject
from epp.datastore import Metrics, new_datastore
from epp.server.http import debug_view
from harness.cluster import releases
from harness.cluster.builders import PodBuilder
from tests.unit.api import objects


def test_debug_view_of_a_v1_pool() -> None:
    store = new_datastore()
    store.pool_set(
        v1.pool_from_api(
            objects.pool_v1(
                ns="default",
                ports=(8000, 8001),
                app_protocol="kubernetes.io/h2c",
                picker={"name": "epp", "port": {"number": 9002}},
            )
        )
    )
    store.pod_update_or_add(PodObject.from_api(PodBuilder("p1").labels(app="vllm").ready("10.0.0.1").build()))
    (rank1,) = [e for e in store.pod_get_all() if e.pod.key.rank == 1]
    store.pod_update_metrics_if_exist(rank1.pod.key, Metrics(waiting_queue_size=4, updated_at=9.0))
    store.objective_set(v1.objective_from_api(objects.objective("bulk", -2, ns="default")))
    store.rewrite_set(
        v1.rewrite_from_api(
            objects.rewrite(
                "young", objects.rule("llama", targets=[("young", 1)]), objects.rule(targets=[("any", 1)]),
                ns="default", age_s=10,
            )
        )
    )  # fmt: skip
    store.rewrite_set(
        v1.rewrite_from_api(objects.rewrite("old", objects.rule("llama", targets=[("old", 1)]), ns="default"))
    )

    view = debug_view(store, now=10.0)

    assert view["pool"] == {
        "namespace": "default",
        "name": "pool",
        "selector": {"app": "vllm"},
        "targetPortNumber": 8000,
        "group": releases.V1.pool_group,
        "targetPorts": [8000, 8001],
        "appProtocol": "kubernetes.io/h2c",
        "endpointPickerRef": {
            "group": "",
            "kind": "Service",
            "name": "epp",
            "port": 9002,
            "failureMode": "FailClose",
        },
    }
    assert [
        (p["name"], p["address"], p["port"], p["rank"], p["metricsAgeSeconds"]) for p in view["pods"]
    ] == [
        ("p1", "10.0.0.1", 8000, 0, None),
        ("p1", "10.0.0.1", 8001, 1, 1.0),
    ]
    assert view["objectives"] == [
        {
            "namespace": "default",
            "name": "bulk",
            "priority": -2,
            "effectivePriority": -2,
            "sheddable": True,
            "poolRef": {"group": releases.V1.pool_group, "kind": "InferencePool", "name": "pool"},
        }
    ]
    assert [r["name"] for r in view["rewrites"]] == ["old", "young"]
    assert view["rewrites"][1]["rules"] == [
        {"models": ["llama"], "targets": [{"name": "young", "weight": 1}]},
        {"models": [], "targets": [{"name": "any", "weight": 1}]},
    ]
    # The oldest object wins its exact model; a catch-all names no model.
    assert view["models"] == [
        {
            "namespace": "default",
            "name": "old",
            "modelName": "llama",
            "criticality": None,
            "targetModels": [{"name": "old", "weight": 1}],
            "poolRef": {"name": "pool"},
        }
    ]
