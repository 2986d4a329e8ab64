"""The EPP as a process: a restart rebuilds the same state; two EPPs on two pools never see each other."""

from __future__ import annotations

import json
from pathlib import Path

from kubernetes.client import ApiClient

from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ClusterAccess

from .support import MODEL, serving


def comparable(view: dict[str, object]) -> dict[str, object]:
    """The datastore view without what legitimately differs across restarts (metrics and their age)."""
    pods = view["pods"]
    assert isinstance(pods, list)
    return {
        "pool": view["pool"],
        "models": view["models"],
        "pods": [{k: v for k, v in p.items() if k not in ("metrics", "metricsAgeSeconds")} for p in pods],
    }


def test_epp_restarted_mid_run_rebuilds_the_same_state(testbed: TestBed) -> None:
    testbed.start_epp()
    testbed.eventually_consistent()
    testbed.apply_pool()
    testbed.eventually_consistent()
    testbed.apply_model(MODEL, criticality="Critical", targets=[("chat-v1", 100)])
    testbed.eventually_consistent()
    testbed.apply_model("direct", criticality="Critical")
    testbed.eventually_consistent()
    testbed.apply_model("elsewhere", pool="other-pool")
    testbed.eventually_consistent()
    for name in ("p1", "p2"):
        testbed.add_pod(name)
        testbed.eventually_consistent()
    testbed.add_pod("p3", pre_stop=120)  # its deletion stays open while its preStop hook runs
    testbed.eventually_consistent()
    testbed.pod_unready("p2")
    testbed.eventually_consistent()
    testbed.terminate_pod("p3")
    testbed.eventually_consistent()
    testbed.add_pod("stranger", labels={"app": "elsewhere"})
    testbed.eventually_consistent()
    before = comparable(testbed.view())
    assert set(testbed.datastore_pods()) == {"p1"}

    testbed.restart_epp()
    testbed.eventually_consistent()
    assert comparable(testbed.view()) == before
    assert testbed.epp.health() == "SERVING"
    assert testbed.routed_pod(MODEL) == "p1"
    assert testbed.routed_pod("direct") == "p1"

    # And it keeps following the API after the restart.
    testbed.pod_ready("p2")
    testbed.eventually_consistent()
    testbed.force_delete_pod("p3")
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p1", "p2"}


def test_changes_made_while_the_epp_is_down_are_seen_at_start(testbed: TestBed) -> None:
    serving(testbed, "p1", "p2")

    testbed.stop_epp()  # no oracle while it is down: there is no view to compare
    testbed.delete_pod("p1")
    testbed.pod_recreate("p2")  # same name, new address
    testbed.add_pod("p3")
    testbed.delete_model(MODEL)
    testbed.apply_model("summarise", criticality="Critical")
    testbed.start_epp()
    testbed.eventually_consistent()
    assert testbed.datastore_pods() == {"p2": testbed.pods["p2"].ip, "p3": testbed.pods["p3"].ip}
    assert testbed.datastore_models() == {"summarise": "summarise"}
    testbed.assert_not_declared(MODEL)


def test_two_pools_in_two_namespaces_served_by_two_epps_without_crosstalk(
    testbed: TestBed, kube_api: ApiClient, control_plane: ClusterAccess
) -> None:
    beds: dict[str, TestBed] = {"a": testbed}
    other = TestBed(kube_api, testbed.create_namespace("b"), Path(control_plane.kubeconfig_path))
    beds["b"] = other
    try:
        for bed in beds.values():
            bed.start_epp()
            bed.eventually_consistent()

        def each(step: str) -> None:
            """Run one step on both beds (same names on purpose), then check both oracles."""
            for label, bed in beds.items():
                if step == "pool":
                    bed.apply_pool()
                elif step == "model":
                    bed.apply_model(MODEL, criticality="Critical", targets=[(f"chat-{label}", 100)])
                elif step == "pods":
                    bed.add_pod("p1")
                    bed.add_pod(f"only-{label}")
                for checked in beds.values():
                    checked.eventually_consistent()

        for step in ("pool", "model", "pods"):
            each(step)

        for label, bed in beds.items():
            view = bed.view()
            assert view["pool"]["namespace"] == bed.namespace
            assert {(p["namespace"], p["name"]) for p in view["pods"]} == {
                (bed.namespace, "p1"),
                (bed.namespace, f"only-{label}"),
            }
            assert bed.datastore_pods()["p1"] == bed.pods["p1"].ip
            for _ in range(5):
                result = bed.route(MODEL)
                assert result.status == 200, result.message
                assert bed.pod_for_endpoint(result.endpoint) is not None, "routed to the other bed's pod"
                assert result.body is not None
                assert json.loads(result.body)["model"] == f"chat-{label}"

        testbed.delete_pool()  # one pool goes: only its EPP notices
        for bed in beds.values():
            bed.eventually_consistent()
        assert testbed.epp.health() == "NOT_SERVING"
        assert other.epp.health() == "SERVING"
        assert set(other.datastore_pods()) == {"p1", "only-b"}

        other.delete_pod("p1")
        for bed in beds.values():
            bed.eventually_consistent()
        assert set(other.datastore_pods()) == {"only-b"}
        assert testbed.view()["pods"] == []
    finally:
        other.close()
