"""The node agent's container runtime: a pod whose image is one of ours runs as a real container.

The container tier (opt-in, README "The container tier"). The run's engine is the one the plane's node
agent was given; the simulator's image (``harness.nodeagent.sim_image``) is made ready in it. Pods are
created through the API and bound by the real scheduler; what is asserted is what the API server says
(status), what the pod's address answers, and what the engine and the kernel say of the container
(``docker inspect``, its cgroup files, ``/proc/<pid>/status``).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from harness.base.eventually import eventually
from harness.cluster.container_engine import DockerCommandError, DockerEngine
from harness.cluster.container_images import ImageReady
from harness.cluster.kube import JsonObject, Kube
from harness.cluster.pod_status import container_statuses, is_ready
from harness.nodeagent.containers import POD_UID_LABEL
from tests import pods

pytestmark = [pytest.mark.e2e, pytest.mark.containers, pytest.mark.timeout(900)]

TIMEOUT_S = 90.0
MEMORY_LIMIT = 256 * 2**20
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CHART_LIKE_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}


def sim_pod(name: str, image: str, **container: Any) -> JsonObject:
    spec: JsonObject = {
        "name": "sim",
        "image": image,
        "args": ["--model=base", "--port=8000"],
        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1},
        **container,
    }
    restart = spec.pop("restartPolicy", "Always")
    pod_spec = {"containers": [spec], "terminationGracePeriodSeconds": 5, "restartPolicy": restart}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}


def wait_for(kube: Kube, namespace: str, name: str, check: Callable[[JsonObject], None]) -> JsonObject:
    return pods.wait_for(kube, namespace, name, check, TIMEOUT_S)


def inspect(engine: DockerEngine, container_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(engine.docker("inspect", container_id))
    return found[0]


def containers_of(engine: DockerEngine, uid: str) -> list[str]:
    return engine.docker("ps", "-aq", "--filter", f"label={POD_UID_LABEL}={uid}").split()


def cgroup_value(engine: DockerEngine, controller: str, container_id: str, name: str) -> int:
    """A cgroup v1 file of the container, read on the host (under the engine's cgroup parent)."""
    root = Path("/sys/fs/cgroup") / controller / engine.cgroup_parent / container_id
    return int((root / name).read_text().strip())


def status_fields(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def test_a_pod_of_our_image_is_a_container_under_its_security_context_and_limits(
    kube_api: ApiClient, namespace: str, container_engine: DockerEngine, sim_image: ImageReady
) -> None:
    kube = Kube(kube_api)
    limits = {"cpu": "500m", "memory": str(MEMORY_LIMIT)}
    body = sim_pod(
        "in-a-container",
        sim_image.tag,
        securityContext=CHART_LIKE_SECURITY,
        resources={"limits": limits, "requests": {"cpu": "250m"}},
        volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}],
    )
    body["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}]
    kube.pods.create(namespace, body)

    def running_ready(found: JsonObject) -> None:
        assert is_ready(found), (found["status"].get("conditions"), container_statuses(found))

    found = wait_for(kube, namespace, "in-a-container", running_ready)
    status = pods.the_container(found)
    assert status["containerID"].startswith("docker://"), status
    container_id = status["containerID"].removeprefix("docker://")
    image_id = json.loads(container_engine.docker("image", "inspect", sim_image.tag))[0]["Id"]
    assert status["imageID"] == f"docker://{image_id}"

    # The pod's address answers, from inside the container.
    ip = found["status"]["podIP"]
    with urllib.request.urlopen(f"http://{ip}:8000/v1/models", timeout=10) as response:
        assert json.load(response)["data"][0]["id"] == "base"

    details = inspect(container_engine, container_id)
    host = details["HostConfig"]
    assert host["NetworkMode"] == "host"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == MEMORY_LIMIT
    assert details["Config"]["Labels"][POD_UID_LABEL] == found["metadata"]["uid"]
    # What the kernel enforces: the cgroup files, and the process's own view.
    assert cgroup_value(container_engine, "memory", container_id, "memory.limit_in_bytes") == MEMORY_LIMIT
    assert cgroup_value(container_engine, "cpu", container_id, "cpu.cfs_quota_us") == 50_000
    assert cgroup_value(container_engine, "cpu", container_id, "cpu.shares") == 256
    pid = int(details["State"]["Pid"])
    fields = status_fields(pid)
    assert fields["Uid"].split() == ["65532"] * 4, fields["Uid"]
    assert int(fields["CapEff"], 16) == 0
    assert fields["NoNewPrivs"] == "1"
    assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")

    # The ServiceAccount volume where a kubelet mounts it, readable by the image's user, read-only;
    # the root filesystem read-only; the in-memory emptyDir writable.
    def in_container(code: str) -> str:
        """What ``python3 -c code`` printed in the container, or its error output."""
        try:
            return container_engine.docker("exec", container_id, "python3", "-c", code)
        except DockerCommandError as exc:
            return str(exc)

    assert in_container(f"print(open('{SERVICE_ACCOUNT_DIR}/namespace').read())").strip() == namespace
    token = in_container(f"print(open('{SERVICE_ACCOUNT_DIR}/token').read())").strip()
    assert token.count(".") == 2, "a JWT"
    assert "Read-only file system" in in_container(f"open('{SERVICE_ACCOUNT_DIR}/x', 'w')")
    assert "Read-only file system" in in_container("open('/written', 'w')")
    assert in_container("open('/scratch/x', 'w').write('ok'); print('wrote')").strip() == "wrote"

    uid = found["metadata"]["uid"]
    kube.pods.delete(namespace, "in-a-container")

    def removed() -> None:
        assert not containers_of(container_engine, uid), "the pod's container is still in the engine"

    eventually(removed, timeout=TIMEOUT_S, message="the deleted pod's container removed")


def test_a_container_that_exits_is_restarted_and_its_exit_code_reported(
    kube_api: ApiClient, namespace: str, sim_image: ImageReady
) -> None:
    kube = Kube(kube_api)
    exits = {"command": ["python3", "-c", "import sys; print('bye'); sys.exit(3)"]}
    kube.pods.create(namespace, sim_pod("restarts", sim_image.tag, **exits))
    kube.pods.create(namespace, sim_pod("once", sim_image.tag, restartPolicy="Never", **exits))

    def restarted(found: JsonObject) -> None:
        status = pods.the_container(found)
        assert status["restartCount"] >= 1, status
        last = status["lastState"].get("terminated") or {}
        assert last.get("exitCode") == 3, status
        assert last.get("reason") == "Error", status
        assert str(last.get("containerID", "")).startswith("docker://"), status

    wait_for(kube, namespace, "restarts", restarted)

    def failed(found: JsonObject) -> None:
        assert found["status"].get("phase") == "Failed", found["status"]
        terminated = pods.the_container(found)["state"]["terminated"]
        assert terminated["exitCode"] == 3, terminated

    wait_for(kube, namespace, "once", failed)


def test_a_container_over_its_memory_limit_is_oom_killed(
    kube_api: ApiClient, namespace: str, sim_image: ImageReady
) -> None:
    kube = Kube(kube_api)
    grow = {"command": ["python3", "-c", "x = bytearray(512 * 2**20); print(len(x))"]}
    body = sim_pod("oom", sim_image.tag, restartPolicy="Never",
                   resources={"limits": {"memory": "64Mi"}}, **grow)  # fmt: skip
    kube.pods.create(namespace, body)

    def oom_killed(found: JsonObject) -> None:
        terminated = pods.the_container(found)["state"].get("terminated") or {}
        assert terminated.get("reason") == "OOMKilled", pods.the_container(found)
        assert terminated.get("exitCode") == 137, terminated

    wait_for(kube, namespace, "oom", oom_killed)


def test_run_as_non_root_with_user_zero_is_refused_before_anything_runs(
    kube_api: ApiClient, namespace: str, sim_image: ImageReady, container_engine: DockerEngine
) -> None:
    kube = Kube(kube_api)
    security = {"runAsNonRoot": True, "runAsUser": 0}
    created = kube.pods.create(namespace, sim_pod("as-root", sim_image.tag, securityContext=security))

    def refused(found: JsonObject) -> None:
        waiting = pods.the_container(found)["state"].get("waiting") or {}
        assert waiting.get("reason") == "CreateContainerConfigError", pods.the_container(found)
        assert "runAsUser breaks non-root policy" in waiting.get("message", ""), waiting

    wait_for(kube, namespace, "as-root", refused)
    assert not containers_of(container_engine, created["metadata"]["uid"]), "a container was created"
