"""A pod's status as a kubelet writes it, computed from the agent's view of its containers (pure).

The agent keeps one ``ContainerStatus`` per container and writes the pod status from them with a
strategic merge patch on the status subresource: ``conditions`` merge by ``type``, so the conditions a
kubelet owns (PodReadyToStartContainers, Initialized, ContainersReady, Ready) are sent and the others
(the scheduler's PodScheduled, a DisruptionTarget) are left alone; ``containerStatuses`` is replaced
whole. ``lastTransitionTime`` moves only when a condition's status changes.

The phase follows the kubelet's ``getPhase``: Pending while a container waits without ever having run
(an image pull failure keeps a pod Pending), Running while one runs or restarts, and for containers
that will not restart Succeeded or Failed by their exit codes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

JsonObject = dict[str, Any]

KUBELET_CONDITIONS: Final = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerStatus:
    """What the agent knows about one container; ``to_json`` is its ``containerStatuses`` entry."""

    name: str
    image: str
    image_id: str = ""
    container_id: str | None = None
    state: str = "waiting"  # waiting | running | terminated
    reason: str | None = "ContainerCreating"
    message: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    signal: int | None = None
    last_terminated: JsonObject | None = None
    restart_count: int = 0
    ready: bool = False
    started: bool = False  # running and past its startup probe (if any)

    def waiting(self, reason: str, message: str | None = None) -> None:
        self.state, self.reason, self.message = "waiting", reason, message
        self.ready = self.started = False

    def running(self, container_id: str, at: datetime) -> None:
        self.state, self.reason, self.message = "running", None, None
        self.container_id, self.started_at = container_id, at
        self.finished_at = self.exit_code = self.signal = None
        self.ready = False

    def terminated(self, exit_code: int, signal: int | None, reason: str, at: datetime) -> None:
        self.state, self.reason, self.message = "terminated", reason, None
        self.exit_code, self.signal, self.finished_at = exit_code, signal, at
        self.ready = self.started = False

    def keep_as_last(self) -> None:
        """Before a restart: the current terminated state becomes ``lastState``."""
        if self.state == "terminated":
            self.last_terminated = self._terminated_json()

    @property
    def ever_ran(self) -> bool:
        return self.state in ("running", "terminated") or self.last_terminated is not None

    def _terminated_json(self) -> JsonObject:
        terminated: JsonObject = {
            "exitCode": self.exit_code if self.exit_code is not None else 0,
            "reason": self.reason or "Error",
            "startedAt": rfc3339(self.started_at) if self.started_at else None,
            "finishedAt": rfc3339(self.finished_at) if self.finished_at else None,
            "containerID": self.container_id,
        }
        if self.signal is not None:
            terminated["signal"] = self.signal
        return terminated

    def to_json(self) -> JsonObject:
        state: JsonObject
        if self.state == "running":
            state = {"running": {"startedAt": rfc3339(self.started_at) if self.started_at else None}}
        elif self.state == "terminated":
            state = {"terminated": self._terminated_json()}
        else:
            waiting: JsonObject = {"reason": self.reason or "ContainerCreating"}
            if self.message:
                waiting["message"] = self.message
            state = {"waiting": waiting}
        status: JsonObject = {
            "name": self.name,
            "image": self.image,
            "imageID": self.image_id,
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def phase(containers: Sequence[ContainerStatus], restart_policy: str, terminal: bool = False) -> str:
    """The kubelet's ``getPhase`` over regular containers (``terminal``: the pod is being removed and
    every container has stopped for good)."""
    waiting = sum(1 for c in containers if c.state == "waiting" and not c.ever_ran)
    running = sum(1 for c in containers if c.state == "running")
    stopped = len(containers) - waiting - running
    succeeded = sum(1 for c in containers if c.state == "terminated" and c.exit_code == 0)
    if terminal:
        return "Succeeded" if succeeded == len(containers) else "Failed"
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if not stopped:
        return "Pending"
    if restart_policy == "Always":
        return "Running"
    if restart_policy == "OnFailure":
        return "Succeeded" if stopped == succeeded else "Running"
    return "Succeeded" if stopped == succeeded else "Failed"


@dataclass
class Conditions:
    """The kubelet-owned conditions with the time each last changed (kept across writes)."""

    since: dict[str, tuple[str, str]] = field(default_factory=dict)  # type -> (status, lastTransitionTime)

    def adopt(self, existing: Sequence[Mapping[str, Any]]) -> None:
        """Start from what the pod already says (an agent that took over a running pod)."""
        for c in existing:
            kind = str(c.get("type"))
            if kind in KUBELET_CONDITIONS and kind not in self.since:
                self.since[kind] = (str(c.get("status")), str(c.get("lastTransitionTime") or ""))

    def render(
        self, wanted: Mapping[str, tuple[bool, str | None, str | None]], now: datetime
    ) -> list[JsonObject]:
        out: list[JsonObject] = []
        for kind in KUBELET_CONDITIONS:
            value, reason, message = wanted[kind]
            status = "True" if value else "False"
            old = self.since.get(kind)
            at = old[1] if old is not None and old[0] == status and old[1] else rfc3339(now)
            self.since[kind] = (status, at)
            # Explicit nulls: the conditions are merged by type, so a reason left out would stay.
            condition: JsonObject = {"type": kind, "status": status, "lastProbeTime": None,
                                     "lastTransitionTime": at, "reason": None, "message": None}  # fmt: skip
            if not value and reason:
                condition["reason"] = reason
                condition["message"] = message
            out.append(condition)
        return out


def pod_status(
    *,
    containers: Sequence[ContainerStatus],
    restart_policy: str,
    pod_ip: str | None,
    host_ip: str,
    start_time: datetime,
    conditions: Conditions,
    now: datetime,
    terminal: bool = False,
) -> JsonObject:
    """The ``status`` to patch: phase, conditions, addresses, start time, container statuses."""
    unready = [c.name for c in containers if not c.ready]
    ready = not unready and not terminal
    not_ready_message = f"containers with unready status: [{' '.join(unready)}]" if unready else None
    wanted = {
        "PodReadyToStartContainers": (pod_ip is not None and not terminal, None, None),
        "Initialized": (True, None, None),
        "ContainersReady": (ready, "ContainersNotReady", not_ready_message),
        "Ready": (ready, "ContainersNotReady", not_ready_message),
    }
    status: JsonObject = {
        "phase": phase(containers, restart_policy, terminal),
        "conditions": conditions.render(wanted, now),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": rfc3339(start_time),
        "containerStatuses": [c.to_json() for c in containers],
    }
    if pod_ip is not None:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status
