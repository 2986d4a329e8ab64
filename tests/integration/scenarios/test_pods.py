"""Pod lifecycle scenarios (epp-behaviour.md §3.2, §3.4, §9.1/§9.18): every change goes through the API,
and the pods are run by the node agent as a kubelet runs them.

Each step is followed by `eventually_consistent()`: the oracle, computed from the API server alone,
must match the EPP's /debug/datastore view. Assertions after it pin down what the step was about.
It settles first (`TestBed.settled()`: the EPP has applied the step's write and is idle), so the
negative ones — "p1 must not come back", "another pod's event changes nothing" — cannot pass just
because the EPP has not looked yet. Readiness changes are real: the simulator's health endpoint is
told to fail, its readiness probe fails, and the agent writes Ready=False.
"""

from __future__ import annotations

from harness.base.eventually import eventually
from harness.beds.testbed import TestBed
from harness.cluster.pod_status import container_statuses, is_ready

from .support import MODEL, serving

# Long enough that the pod is still terminating (and Ready) through every check below; the test ends
# it with a force delete.
PRE_STOP_S = 120


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
    """No kubelet changes a running pod's IP; a forged pod does, for the reconciler's update path."""
    serving(testbed)
    testbed.add_forged_pod("p1")
    testbed.eventually_consistent()
    old_ip = testbed.pods["p1"].ip

    new_ip = testbed.forged_move("p1")
    testbed.eventually_consistent()
    assert new_ip != old_ip
    assert testbed.datastore_pods() == {"p1": new_ip}
    assert testbed.route(MODEL).endpoint == f"{new_ip}:8000"


def test_ready_notready_ready_removes_and_restores_the_pod(testbed: TestBed) -> None:
    serving(testbed, "p1", "p2")

    testbed.pod_unready("p1")  # its health fails; the readiness probe takes it out of Ready
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


def test_terminating_pod_is_not_routed_while_it_is_still_ready(testbed: TestBed) -> None:
    """Upstream's "terminating pod still routed" window: deleted, draining in its preStop hook, Ready."""
    serving(testbed, "p2")
    testbed.add_pod("p1", pre_stop=PRE_STOP_S)
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p1", "p2"}

    testbed.terminate_pod("p1")  # graceful delete: the agent keeps it as it is while preStop runs
    testbed.eventually_consistent()
    terminating = testbed.kube.pods.get(testbed.namespace, "p1")
    assert terminating["metadata"].get("deletionTimestamp"), "the pod must still exist, terminating"
    assert is_ready(terminating), "still Ready: only the deletionTimestamp says it is going"
    assert set(testbed.datastore_pods()) == {"p2"}
    assert {testbed.routed_pod(MODEL) for _ in range(5)} == {"p2"}

    testbed.pod_labels("p2", {"touch": "1"})  # another pod's event must not bring p1 back
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p2"}

    testbed.restart_epp()  # the initial list (a full resync) must skip a terminating pod (#713)
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p2"}
    assert is_ready(testbed.kube.pods.get(testbed.namespace, "p1")), "the window was still open"

    testbed.force_delete_pod("p1")
    testbed.eventually_consistent()
    assert "p1" not in {p["metadata"]["name"] for p in testbed.kube.pods.list(testbed.namespace)}
    assert set(testbed.datastore_pods()) == {"p2"}


def test_pod_held_by_a_finalizer_leaves_at_deletion_timestamp(testbed: TestBed) -> None:
    """A finalizer holding a deleted pod at an exact moment: forged, the agent never runs this pod."""
    serving(testbed, "p2")
    testbed.add_forged_pod("p1")
    testbed.eventually_consistent()

    testbed.forged_hold_and_delete("p1")
    testbed.eventually_consistent()
    assert testbed.kube.pods.get(testbed.namespace, "p1")["metadata"].get("deletionTimestamp")
    assert set(testbed.datastore_pods()) == {"p2"}

    testbed.forged_release("p1")
    testbed.eventually_consistent()
    assert "p1" not in {p["metadata"]["name"] for p in testbed.kube.pods.list(testbed.namespace)}
    assert set(testbed.datastore_pods()) == {"p2"}


def test_pod_deleted_is_removed(testbed: TestBed) -> None:
    serving(testbed, "p1", "p2")

    testbed.delete_pod("p1")  # graceful: SIGTERM, Ready=False, the agent's final delete
    testbed.eventually_consistent()
    assert set(testbed.datastore_pods()) == {"p2"}

    testbed.delete_pod("p2")
    testbed.eventually_consistent()
    assert testbed.datastore_pods() == {}
    result = testbed.route(MODEL)
    assert result.status == 503, result


def test_killed_simulator_is_restarted_and_routed_to_again(testbed: TestBed) -> None:
    serving(testbed, "p1")
    ip = testbed.pods["p1"].ip
    before = testbed.sim("p1").pid

    testbed.kill_container("p1")  # SIGKILL, as a crash: the agent restarts it (restartPolicy Always)

    def restarted() -> dict[str, object]:
        pod = testbed.kube.pods.get(testbed.namespace, "p1")
        [status] = container_statuses(pod)
        assert status["restartCount"] == 1, status
        assert is_ready(pod), "not Ready again yet"
        return status

    status = eventually(restarted, timeout=60, message="p1 restarted and Ready")
    assert status["lastState"]["terminated"]["exitCode"] == 137, status  # 128 + SIGKILL
    assert testbed.sim("p1").pid != before, "a new process"
    assert testbed.pods["p1"].ip == ip
    testbed.eventually_consistent()
    assert testbed.routed_pod(MODEL) == "p1"
    assert testbed.sim("p1").requests_by_model() == {}, "routing is not serving: nothing was sent yet"


def test_a_pod_created_unready_can_be_made_ready_at_once(testbed: TestBed) -> None:
    """Running is not listening: a pod created unready is Running as soon as its process starts, and
    the harness must not hand it back before its simulator answers (the churn run once flipped it
    Ready within milliseconds and was refused)."""
    for attempt in range(3):
        name = f"late-{attempt}"
        testbed.add_pod(name, ready=False)
        testbed.pod_ready(name)
        assert is_ready(testbed.kube.pods.get(testbed.namespace, name))
