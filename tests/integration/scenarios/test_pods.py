"""Pod lifecycle scenarios (epp-behaviour.md §3.2, §3.4, §9.1/§9.18): every change goes through the API.

Each step is followed by `eventually_consistent()`: the oracle, computed from the API server alone,
must match the EPP's /debug/datastore view. Assertions after it pin down what the step was about.
It settles first (`TestBed.settled()`: the EPP has applied the step's write and is idle), so the
negative ones — "p1 must not come back", "another pod's event changes nothing" — cannot pass just
because the EPP has not looked yet.
"""

from __future__ import annotations

from harness.testbed import TestBed

from .support import MODEL, serving


def test_pool_created_after_its_pods_picks_up_the_ready_matching_ones(testbed: TestBed) -> None:
    testbed.start_epp()
    testbed.eventually_consistent()
    assert testbed.epp.health() == "NOT_SERVING"

    testbed.add_pod("p1")
    testbed.eventually_consistent()
    testbed.add_pod("p2")
    testbed.eventually_consistent()
    testbed.add_pod("unready", ready=False)
    testbed.eventually_consistent()
    testbed.add_pod("stranger", labels={"app": "elsewhere"})
    testbed.eventually_consistent()
    testbed.apply_model(MODEL, criticality="Critical")
    testbed.eventually_consistent()
    assert testbed.datastore_pods() == {}, "pod events before the pool must be ignored"
    assert testbed.datastore_models() == {}, "models are held only while the pool is known"

    testbed.apply_pool()
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p1", "p2"}
    assert testbed.datastore_models() == {MODEL: MODEL}
    assert testbed.epp.health() == "SERVING"
    assert testbed.routed_pod(MODEL) in {"p1", "p2"}


def test_pod_recreated_with_the_same_name_and_a_new_ip_leaves_one_entry(testbed: TestBed) -> None:
    serving(testbed, "p1")
    old_ip = testbed.pods["p1"].ip
    assert testbed.datastore_pods() == {"p1": old_ip}

    new_ip = testbed.pod_recreate("p1")
    testbed.eventually_consistent()
    assert new_ip != old_ip
    assert testbed.datastore_pods() == {"p1": new_ip}
    assert testbed.route(MODEL).endpoint == f"{new_ip}:8000"


def test_pod_ip_changed_in_place_updates_the_address(testbed: TestBed) -> None:
    serving(testbed, "p1")
    old_ip = testbed.pods["p1"].ip

    new_ip = testbed.pod_move("p1")
    testbed.eventually_consistent()
    assert new_ip != old_ip
    assert testbed.datastore_pods() == {"p1": new_ip}
    assert testbed.route(MODEL).endpoint == f"{new_ip}:8000"


def test_ready_notready_ready_removes_and_restores_the_pod(testbed: TestBed) -> None:
    serving(testbed, "p1", "p2")

    testbed.pod_unready("p1")
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p2"}
    assert {testbed.routed_pod(MODEL) for _ in range(5)} == {"p2"}

    testbed.pod_unready("p2")
    testbed.eventually_consistent()
    assert testbed.datastore_pods() == {}
    assert testbed.route(MODEL).status == 503

    testbed.pod_ready("p1")
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p1"}
    assert testbed.routed_pod(MODEL) == "p1"


def test_label_removed_then_added_back(testbed: TestBed) -> None:
    serving(testbed, "p1", "p2")

    testbed.pod_labels("p1", {"app": None})
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p2"}

    testbed.pod_labels("p1", {"app": "other"})
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p2"}

    testbed.pod_labels("p1", {"app": testbed.pool_name})
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p1", "p2"}

    testbed.pod_labels("p1", {"unrelated": "x"})  # an update that keeps it matching: still there
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p1", "p2"}


def test_pod_held_by_a_finalizer_leaves_at_deletion_timestamp(testbed: TestBed) -> None:
    serving(testbed, "p1", "p2")

    testbed.pod_hold_and_delete("p1")
    testbed.eventually_consistent()
    held = testbed.kube.pods.get(testbed.namespace, "p1")
    assert held["metadata"].get("deletionTimestamp"), "the pod must still exist, terminating"
    assert set(testbed.datastore_pods()) == {"p2"}
    assert {testbed.routed_pod(MODEL) for _ in range(5)} == {"p2"}

    testbed.pod_labels("p2", {"touch": "1"})  # another pod's event must not bring p1 back
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p2"}

    testbed.restart_epp()  # the initial list (a full resync) must skip a terminating pod (#713)
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p2"}

    testbed.pod_release("p1")
    testbed.eventually_consistent()
    assert "p1" not in {p["metadata"]["name"] for p in testbed.kube.pods.list(testbed.namespace)}
    assert set(testbed.datastore_pods()) == {"p2"}


def test_pod_deleted_is_removed(testbed: TestBed) -> None:
    serving(testbed, "p1", "p2")

    testbed.delete_pod("p1")
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p2"}

    testbed.delete_pod("p2")
    testbed.eventually_consistent()
    assert testbed.datastore_pods() == {}
    result = testbed.route(MODEL)
    assert result.status == 503, result
