"""The pod status the agent writes, computed from its containers (pure): phase, conditions, addresses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from harness.nodeagent.status import Conditions, ContainerStatus, phase, pod_status

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def running(name: str = "c", ready: bool = True) -> ContainerStatus:
    status = ContainerStatus(name, "img")
    status.running("harness://1", T0)
    status.ready = status.started = ready
    return status


def exited(code: int, restarted: bool = False) -> ContainerStatus:
    status = running()
    status.terminated(code, None, "Completed" if code == 0 else "Error", T0)
    if restarted:
        status.keep_as_last()
        status.waiting("CrashLoopBackOff", "back-off")
    return status


def pulling() -> ContainerStatus:
    status = ContainerStatus("c", "nowhere")
    status.waiting("ErrImagePull", "not found")
    return status


@pytest.mark.parametrize(
    ("containers", "policy", "terminal", "expected"),
    [
        pytest.param([ContainerStatus("c", "i")], "Always", False, "Pending", id="creating"),
        pytest.param([pulling()], "Always", False, "Pending", id="image-pull-failure"),
        pytest.param([running(), pulling()], "Always", False, "Pending", id="one-never-ran"),
        pytest.param([running()], "Always", False, "Running", id="running"),
        pytest.param([exited(1, restarted=True)], "Always", False, "Running", id="crash-loop"),
        pytest.param([exited(0)], "Always", False, "Running", id="always-restarts-a-clean-exit"),
        pytest.param([exited(0)], "OnFailure", False, "Succeeded", id="on-failure-done"),
        pytest.param([exited(1)], "OnFailure", False, "Running", id="on-failure-restarting"),
        pytest.param([exited(1)], "Never", False, "Failed", id="never-failed"),
        pytest.param([exited(0)], "Never", False, "Succeeded", id="never-succeeded"),
        pytest.param([exited(0), exited(0)], "Always", True, "Succeeded", id="deleted-clean"),
        pytest.param([exited(0), exited(137)], "Always", True, "Failed", id="deleted-killed"),
    ],
)
def test_phase_follows_the_kubelets_rules(
    containers: list[ContainerStatus], policy: str, terminal: bool, expected: str
) -> None:
    assert phase(containers, policy, terminal) == expected


def status_of(
    containers: list[ContainerStatus], conditions: Conditions, now: datetime, *, terminal: bool = False
) -> dict[str, Any]:
    return pod_status(
        containers=containers,
        restart_policy="Always",
        pod_ip="127.0.3.4",
        host_ip="127.0.0.1",
        start_time=T0,
        conditions=conditions,
        now=now,
        terminal=terminal,
    )


def conditions_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_ready_pod_status_has_addresses_and_kubelet_conditions() -> None:
    status = status_of([running()], Conditions(), T0)
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.0.3.4"
    assert status["podIPs"] == [{"ip": "127.0.3.4"}]
    assert status["hostIPs"] == [{"ip": "127.0.0.1"}]
    assert status["startTime"] == "2026-01-02T03:04:05Z"
    conditions = conditions_of(status)
    assert list(conditions) == ["PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"]
    assert all(c["status"] == "True" for c in conditions.values())
    # Merged by type on the server: a reason or message left out would survive from an earlier write.
    assert conditions["Ready"]["reason"] is None
    assert conditions["Ready"]["message"] is None


def test_an_unready_container_makes_the_pod_unready_with_the_kubelets_reason() -> None:
    status = status_of([running("a"), running("b", ready=False)], Conditions(), T0)
    ready = conditions_of(status)["Ready"]
    assert ready["status"] == "False"
    assert ready["reason"] == "ContainersNotReady"
    assert ready["message"] == "containers with unready status: [b]"


def test_transition_time_moves_only_when_the_status_changes() -> None:
    conditions = Conditions()
    first = conditions_of(status_of([running()], conditions, T0))
    later = T0 + timedelta(minutes=1)
    same = conditions_of(status_of([running()], conditions, later))
    assert same["Ready"]["lastTransitionTime"] == first["Ready"]["lastTransitionTime"]
    flipped = conditions_of(status_of([running(ready=False)], conditions, later))
    assert flipped["Ready"]["lastTransitionTime"] == "2026-01-02T03:05:05Z"
    assert flipped["Initialized"]["lastTransitionTime"] == first["Initialized"]["lastTransitionTime"]


def test_a_terminal_pod_is_not_ready_and_its_sandbox_is_gone() -> None:
    status = status_of([exited(0)], Conditions(), T0, terminal=True)
    conditions = conditions_of(status)
    assert status["phase"] == "Succeeded"
    assert conditions["Ready"]["status"] == "False"
    assert conditions["PodReadyToStartContainers"]["status"] == "False"


def test_container_status_json_carries_ids_restarts_and_the_last_termination() -> None:
    status = exited(137, restarted=True)
    status.restart_count = 1
    status.image_id = "img@sha256:ab"
    entry = status.to_json()
    assert entry["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}
    assert entry["lastState"]["terminated"]["exitCode"] == 137
    assert entry["lastState"]["terminated"]["containerID"] == "harness://1"
    assert entry["restartCount"] == 1
    assert entry["imageID"] == "img@sha256:ab"
    assert entry["ready"] is False
