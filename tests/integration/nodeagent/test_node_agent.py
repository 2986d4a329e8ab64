"""The node agent runs pods as a kubelet does, seen only through the API server and the network.

Pods are created through the API with no node chosen; the real scheduler binds them to the agent's
nodes; everything asserted here is what the API server (status, events) or the pod's address answers,
plus the agent's ``/debug/pods`` where a test must prove processes are gone.
"""

from __future__ import annotations

import fcntl
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiClient

from harness.base.addresses import lock_path
from harness.base.eventually import eventually
from harness.cluster.builders import SimPodBuilder
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.kube import JsonObject, Kube
from harness.cluster.kubectl import kubectl
from harness.cluster.namespaces import TEST_LABEL, create_namespace, namespace_name
from harness.cluster.pod_status import is_ready
from harness.sim import ADMIN_PORT_OFFSET, SimAdmin
from tests import pods

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0
LLMD_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "cluster" / "llm-d-inference-sim.yaml"


@pytest.fixture
def agent(control_plane: ClusterAccess) -> str:
    """The node agent's own URL (``/debug/pods``): only the harness's plane runs one."""
    if control_plane.node_agent_url is None:
        pytest.skip("this cluster has no harness node agent")
    return control_plane.node_agent_url


def agent_pods(agent: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{agent}/debug/pods", timeout=10) as response:
        pods: list[dict[str, Any]] = json.load(response)["pods"]
    return pods


def pod(name: str, image: str, *, args: list[str] | None = None, **spec: Any) -> JsonObject:
    container: JsonObject = {"name": "main", "image": image, **({"args": args} if args else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 1, **spec}}  # fmt: skip


def wait_for(kube: Kube, namespace: str, name: str, check: Callable[[JsonObject], None]) -> JsonObject:
    return pods.wait_for(kube, namespace, name, check, TIMEOUT_S)


def running_ready(found: JsonObject) -> None:
    assert found["status"].get("phase") == "Running", found["status"]
    assert is_ready(found), found["status"].get("conditions")


def test_a_running_pod_has_the_status_a_kubelet_writes(
    kube_api: ApiClient, namespace: str, agent: str
) -> None:
    kube = Kube(kube_api)
    body = (
        SimPodBuilder("p1").namespace(namespace).simulator(8000, ["--model=base"]).probe_period(0.1).build()
    )
    kube.pods.create(namespace, body)

    found = wait_for(kube, namespace, "p1", running_ready)
    status = found["status"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == dict.fromkeys(
        ["PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"], "True"
    )
    ip = status["podIP"]
    assert ip.startswith("127."), ip
    assert ip != "127.0.0.1", "a pod address of its own, not the host's"
    assert status["podIPs"] == [{"ip": ip}]
    assert status["hostIP"] == "127.0.0.1"
    assert status["hostIPs"] == [{"ip": "127.0.0.1"}]
    assert status["startTime"]
    container = pods.the_container(found)
    assert container["name"] == "sim"
    assert container["ready"] is True
    assert container["started"] is True
    assert container["restartCount"] == 0
    assert container["containerID"].startswith("harness://")
    assert container["imageID"].startswith("epp-harness/vllm-sim@sha256:")
    assert set(container["state"]) == {"running"}
    nodes = {n["metadata"]["name"] for n in kube_api_nodes(kube_api)}
    assert found["spec"]["nodeName"] in nodes, "bound by the scheduler to one of the agent's nodes"
    # Its servers listen on its own address: the serving port, and the admin port apart.
    with urllib.request.urlopen(f"http://{ip}:8000/v1/models", timeout=10) as response:
        assert json.load(response)["data"][0]["id"] == "base"
    assert SimAdmin(ip, 8000 + ADMIN_PORT_OFFSET).info()["model"] == "base"

    def kubelet_events() -> None:
        events = client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
        reasons = {e.reason for e in events if e.source is not None and e.source.component == "kubelet"}
        assert {"Pulled", "Created", "Started"} <= reasons, reasons

    eventually(kubelet_events, timeout=TIMEOUT_S, message="the kubelet's events")


def kube_api_nodes(kube_api: ApiClient) -> list[JsonObject]:
    items: list[JsonObject] = kube_api.sanitize_for_serialization(
        client.CoreV1Api(kube_api).list_node(label_selector="epp-harness/node-agent=true").items
    )
    return items


def test_an_unknown_image_fails_like_an_image_pull_and_the_pod_stays_pending(
    kube_api: ApiClient, namespace: str, agent: str
) -> None:
    kube = Kube(kube_api)
    kube.pods.create(namespace, pod("nowhere", "example.invalid/no-such-image:1"))
    reasons: set[str] = set()

    def both_reasons(found: JsonObject) -> None:
        assert found["status"]["phase"] == "Pending", found["status"]
        container = pods.the_container(found)
        reasons.add(container["state"]["waiting"]["reason"])
        # A kubelet says ContainerCreating while it pulls; then the pull fails and backs off.
        assert reasons <= {"ContainerCreating", "ErrImagePull", "ImagePullBackOff"}, reasons
        assert {"ErrImagePull", "ImagePullBackOff"} <= reasons, reasons

    found = wait_for(kube, namespace, "nowhere", both_reasons)
    container = pods.the_container(found)
    assert "example.invalid/no-such-image:1" in container["state"]["waiting"]["message"]
    assert not is_ready(found)


def test_pause_pods_are_cheap_and_ready_without_a_probe(
    kube_api: ApiClient, namespace: str, agent: str
) -> None:
    kube = Kube(kube_api)
    names = [f"pause-{i}" for i in range(3)]
    for name in names:
        kube.pods.create(namespace, pod(name, "registry.k8s.io/pause:3.10"))
    for name in names:
        wait_for(kube, namespace, name, running_ready)
    ours = [p for p in agent_pods(agent) if p["namespace"] == namespace]
    assert sorted(p["name"] for p in ours) == names
    assert all(c["pid"] for p in ours for c in p["containers"]), ours


def test_upstreams_llm_d_simulator_deployment_runs_unchanged(
    kube_api: ApiClient, namespace: str, control_plane: ClusterAccess, agent: str
) -> None:
    kubectl(control_plane.kubeconfig_path, "apply", "-f", str(LLMD_EXAMPLE), namespace=namespace)
    [deployment] = [d for d in yaml.safe_load_all(LLMD_EXAMPLE.read_text()) if d["kind"] == "Deployment"]
    kube = Kube(kube_api)

    def replicas_ready() -> list[JsonObject]:
        pods = kube.pods.list(namespace)
        assert len(pods) == deployment["spec"]["replicas"], [p["metadata"]["name"] for p in pods]
        for found in pods:
            running_ready(found)
        return pods

    pods = eventually(replicas_ready, timeout=TIMEOUT_S, message="the llm-d Deployment is up")
    for found in pods:
        ip = found["status"]["podIP"]
        # No readiness probe upstream: Ready once started, maybe before it listens.
        served = eventually(lambda ip=ip: models_at(ip), timeout=TIMEOUT_S, retry_on=(OSError,), message=ip)
        assert served == ["meta-llama/Llama-3.1-8B-Instruct", "food-review-1"]


def models_at(ip: str) -> list[str]:
    with urllib.request.urlopen(f"http://{ip}:8000/v1/models", timeout=10) as response:
        return [m["id"] for m in json.load(response)["data"]]


def test_a_crashing_container_is_restarted_with_a_growing_backoff(
    kube_api: ApiClient, namespace: str, agent: str
) -> None:
    kube = Kube(kube_api)
    kube.pods.create(namespace, pod("crasher", "epp-harness/vllm-sim:1", args=["--no-such-flag"]))

    def crash_looping(found: JsonObject) -> None:
        container = pods.the_container(found)
        assert container["restartCount"] >= 2, container
        assert container["lastState"]["terminated"]["exitCode"] == 2, container  # argparse's usage error
        assert container["lastState"]["terminated"]["reason"] == "Error", container
        assert container["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff", container

    found = wait_for(kube, namespace, "crasher", crash_looping)
    assert found["status"]["phase"] == "Running", "restarting: Running, as a kubelet says (never Ready)"
    assert not is_ready(found)


def test_restart_policy_never_leaves_a_failed_pod(kube_api: ApiClient, namespace: str, agent: str) -> None:
    kube = Kube(kube_api)
    kube.pods.create(
        namespace, pod("once", "epp-harness/vllm-sim:1", args=["--no-such-flag"], restartPolicy="Never")
    )

    def failed(found: JsonObject) -> None:
        assert found["status"]["phase"] == "Failed", found["status"]

    found = wait_for(kube, namespace, "once", failed)
    container = pods.the_container(found)
    assert container["restartCount"] == 0
    assert container["state"]["terminated"]["exitCode"] == 2


def test_a_failing_liveness_probe_restarts_the_container(
    kube_api: ApiClient, namespace: str, agent: str
) -> None:
    kube = Kube(kube_api)
    body = SimPodBuilder("sick").namespace(namespace).simulator(8000, healthy=False).probe_period(0.1).build()
    body["spec"]["containers"][0]["livenessProbe"] = {"httpGet": {"path": "/health", "port": 8000},
                                                      "failureThreshold": 2}  # fmt: skip
    kube.pods.create(namespace, body)

    def restarted(found: JsonObject) -> None:
        container = pods.the_container(found)
        assert container["restartCount"] >= 1, container

    found = wait_for(kube, namespace, "sick", restarted)
    container = pods.the_container(found)
    assert container["lastState"]["terminated"]["exitCode"] == 0, "stopped with SIGTERM: a clean exit"
    assert not is_ready(found)


def test_env_field_refs_and_variable_expansion_reach_the_process(
    kube_api: ApiClient, namespace: str, agent: str
) -> None:
    kube = Kube(kube_api)
    body = (
        SimPodBuilder("named").namespace(namespace).simulator(8000, ["--model=$(POD_NAME)-in-$(NS)"]).build()
    )
    body["spec"]["containers"][0]["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    body["metadata"]["annotations"] = {"epp-harness/probe-period-seconds": "0.1"}
    kube.pods.create(namespace, body)
    found = wait_for(kube, namespace, "named", running_ready)
    info = SimAdmin(found["status"]["podIP"], 8000 + ADMIN_PORT_OFFSET).info()
    assert info["model"] == f"named-in-{namespace}"


def test_a_deleted_namespace_takes_its_pods_processes_and_addresses_with_it(
    kube_api: ApiClient, agent: str
) -> None:
    """Tests clean up by deleting their namespace: nothing of its pods may outlive it."""
    name = namespace_name("teardown")
    create_namespace(kube_api, name, TEST_LABEL)
    kube = Kube(kube_api)
    # Short grace periods: the namespace controller re-checks a namespace after the longest one.
    sim = SimPodBuilder("sim").namespace(name).simulator(8000).probe_period(0.1).grace_period(1).build()
    kube.pods.create(name, sim)
    kube.pods.create(name, pod("pause", "registry.k8s.io/pause:3.10"))
    for pod_name in ("sim", "pause"):
        wait_for(kube, name, pod_name, running_ready)
    ours = [p for p in agent_pods(agent) if p["namespace"] == name]
    pids = [c["pid"] for p in ours for c in p["containers"]]
    ips = [p["ip"] for p in ours]
    assert len(pids) == 2
    assert all(pids)

    client.CoreV1Api(kube_api).delete_namespace(name)

    def gone() -> None:
        names = [n.metadata.name for n in client.CoreV1Api(kube_api).list_namespace().items if n.metadata]
        assert name not in names, f"namespace {name} still exists"

    eventually(gone, timeout=TIMEOUT_S, message=f"namespace {name} deleted")
    assert [p for p in agent_pods(agent) if p["namespace"] == name] == []
    assert [pid for pid in pids if _alive(pid)] == [], "every container process is gone"
    for ip in ips:
        with open(lock_path(ip), "wb") as handle:  # the agent's reservation is released
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_force_deleted_pod_is_stopped(kube_api: ApiClient, namespace: str, agent: str) -> None:
    kube = Kube(kube_api)
    builder = SimPodBuilder("p1").namespace(namespace).simulator(8000).probe_period(0.1)
    body = builder.pre_stop(120).grace_period(180).build()
    kube.pods.create(namespace, body)
    wait_for(kube, namespace, "p1", running_ready)
    [ours] = [p for p in agent_pods(agent) if p["namespace"] == namespace]
    [pid] = [c["pid"] for c in ours["containers"]]

    kube.pods.delete(namespace, "p1", grace_period_seconds=0)  # kubectl delete --force --grace-period=0

    def stopped() -> None:
        assert not _alive(pid), f"process {pid} still runs"
        assert [p for p in agent_pods(agent) if p["namespace"] == namespace] == []

    eventually(stopped, timeout=TIMEOUT_S, message="the agent stopped the force-deleted pod")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
