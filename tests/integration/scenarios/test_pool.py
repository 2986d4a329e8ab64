"""InferencePool scenarios (epp-behaviour.md §3.1, §3.4, §9.4-§9.6): selector, port, deletion, re-creation."""

from __future__ import annotations

import json
from typing import Any

from harness.beds.testbed import TestBed

from .support import MODEL, serving

OLD_PORT = 8000
NEW_PORT = 8001
IDLE: dict[str, Any] = {"waiting": 0, "kv_cache": 0.1}
BUSY: dict[str, Any] = {"waiting": 50, "kv_cache": 0.7}


def test_pool_selector_changed_moves_pods_in_and_out(testbed: TestBed) -> None:
    testbed.start_epp()
    testbed.eventually_consistent()
    testbed.apply_pool(selector={"app": "a"})
    testbed.eventually_consistent()
    testbed.apply_model(MODEL, criticality="Critical")
    testbed.eventually_consistent()
    for name, labels in {
        "a1": {"app": "a", "tier": "gold"},
        "a2": {"app": "a"},
        "b1": {"app": "b", "tier": "gold"},
    }.items():
        testbed.add_pod(name, labels)
        testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"a1", "a2"}

    testbed.apply_pool(selector={"app": "b"})
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"b1"}
    assert testbed.routed_pod(MODEL) == "b1"

    testbed.apply_pool(selector={"tier": "gold"})
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"a1", "b1"}

    testbed.apply_pool(selector={"app": "a", "tier": "gold"})  # every key must match
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"a1"}
    assert testbed.routed_pod(MODEL) == "a1"

    testbed.pod_labels("a2", {"tier": "gold"})  # a pod event under the new selector
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"a1", "a2"}


def test_pool_port_changed_routes_and_scrapes_the_new_port_without_a_pod_event(testbed: TestBed) -> None:
    """Each pod has a container on each port with opposite load, so routing and scraping show the port."""
    testbed.start_epp()
    testbed.eventually_consistent()
    testbed.apply_pool(port=OLD_PORT)
    testbed.eventually_consistent()
    testbed.apply_model(MODEL, criticality="Critical")
    testbed.eventually_consistent()
    for name in ("p1", "p2"):
        testbed.add_pod(name, ports=(OLD_PORT, NEW_PORT))  # a simulator container on each port
        testbed.eventually_consistent()
    testbed.set_gauges("p1", port=OLD_PORT, **IDLE)
    testbed.set_gauges("p2", port=OLD_PORT, **BUSY)
    testbed.set_gauges("p1", port=NEW_PORT, **BUSY)
    testbed.set_gauges("p2", port=NEW_PORT, **IDLE)
    testbed.eventually_gauges("p1", **IDLE)
    testbed.eventually_gauges("p2", **BUSY)
    result = testbed.route(MODEL)
    assert result.endpoint == f"{testbed.pods['p1'].ip}:{OLD_PORT}", result
    pod_versions = {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"]
        for p in testbed.kube.pods.list(testbed.namespace)
    }

    testbed.apply_pool(port=NEW_PORT)
    testbed.eventually_consistent()  # the oracle also checks the datastore's targetPortNumber
    testbed.eventually_gauges("p1", **BUSY)  # now scraped from NEW_PORT
    testbed.eventually_gauges("p2", **IDLE)
    result = testbed.route(MODEL)
    assert result.endpoint == f"{testbed.pods['p2'].ip}:{NEW_PORT}", result
    assert result.header_endpoint == result.endpoint
    after = {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"]
        for p in testbed.kube.pods.list(testbed.namespace)
    }
    assert after == pod_versions, "the port change must not need any pod event"


def test_pool_deleted_clears_pods_and_models_and_health_goes_not_serving(testbed: TestBed) -> None:
    serving(testbed, "p1")
    assert testbed.epp.health() == "SERVING"

    testbed.delete_pool()
    testbed.eventually_consistent()
    view = testbed.view()
    assert (view["pool"], view["pods"], view["models"]) == (None, [], [])
    assert testbed.epp.health() == "NOT_SERVING"
    result = testbed.route(MODEL)
    assert result.status in (404, 503), result  # no model and no pool: nothing is routable
    assert testbed.route(None, bodyless=True).status == 503

    testbed.add_pod("p2")  # pod events while there is no pool are ignored
    testbed.eventually_consistent()
    assert testbed.datastore_pods() == {}


def test_pool_recreated_brings_back_pods_and_models(testbed: TestBed) -> None:
    serving(testbed, "p1")
    testbed.apply_model("summarise", targets=[("summarise-v2", 100)], criticality="Critical")
    testbed.eventually_consistent()

    testbed.delete_pool()
    testbed.eventually_consistent()
    assert testbed.datastore_models() == {}

    testbed.apply_pool()
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p1"}
    assert testbed.datastore_models() == {MODEL: MODEL, "summarise": "summarise"}  # upstream lost these
    assert testbed.epp.health() == "SERVING"
    assert testbed.routed_pod(MODEL) == "p1"
    result = testbed.route("summarise")
    assert result.status == 200, result.message
    assert result.body is not None
    assert json.loads(result.body)["model"] == "summarise-v2"
