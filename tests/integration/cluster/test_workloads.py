"""The full plane behaves like a cluster: what kubectl applies is acted on by the real scheduler and
controllers (nodes come from ``harness.cluster.nodes``: registered like kubelets, nothing runs the pods).

Pods bound to a node with no kubelet stay Terminating after a delete (nobody confirms it), so the
checks assert what the controllers do (deletionTimestamp set, owners gone), and each test ends by
force-deleting its pods and removing its nodes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from harness.base.eventually import eventually
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.kubectl import kubectl
from harness.cluster.namespaces import TEST_LABEL, create_namespace, namespace_name
from harness.cluster.nodes import LEASE_NAMESPACE, NODE_SET_KEY, NodeSet

pytestmark = pytest.mark.integration

JsonObject = dict[str, Any]
TIMEOUT = 60.0


def deployment(name: str, replicas: int, pod_spec_fields: JsonObject) -> JsonObject:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "web", "image": "web:1"}], **pod_spec_fields},
            },
        },
    }


def get(kubeconfig: Path, namespace: str, kind: str) -> list[JsonObject]:
    items: list[JsonObject] = json.loads(kubectl(kubeconfig, "get", kind, "-o", "json", namespace=namespace))[
        "items"
    ]
    return items


@pytest.fixture
def nodes(kube_api: ApiClient, control_plane: ClusterAccess, namespace: str) -> Iterator[NodeSet]:
    """Two nodes of this test's own; at the end the test's pods are force-deleted, then the nodes."""
    with NodeSet(kube_api, count=2) as node_set:
        try:
            yield node_set
        finally:
            kubectl(control_plane.kubeconfig_path, "delete", "pods", "--all", "--force", "--grace-period=0",
                    "--wait=false", namespace=namespace)  # fmt: skip


def test_kubectl_apply_deployment_gets_a_replicaset_and_pods_bound_by_the_scheduler(
    control_plane: ClusterAccess, namespace: str, nodes: NodeSet
) -> None:
    kubeconfig = control_plane.kubeconfig_path
    manifest = yaml.safe_dump(deployment("web", 3, nodes.pod_spec_fields()))

    kubectl(kubeconfig, "apply", "-f", "-", namespace=namespace, stdin=manifest)

    def three_pods_bound() -> list[JsonObject]:
        pods = get(kubeconfig, namespace, "pods")
        assert len(pods) == 3, [p["metadata"]["name"] for p in pods]
        assert all(p["spec"].get("nodeName") in nodes.names for p in pods), [p["spec"] for p in pods]
        return pods

    pods = eventually(three_pods_bound, timeout=TIMEOUT, message="3 pods bound to our nodes")
    (replica_set,) = get(kubeconfig, namespace, "replicasets")
    assert replica_set["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    assert replica_set["spec"]["replicas"] == 3
    for pod in pods:
        assert pod["metadata"]["ownerReferences"][0]["name"] == replica_set["metadata"]["name"]
        scheduled = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert scheduled["PodScheduled"] == "True"
        assert pod["spec"]["serviceAccountName"] == "default"  # ServiceAccount admission ran

    def scheduler_reported() -> None:
        events = get(kubeconfig, namespace, "events")
        bound = {
            e["involvedObject"]["name"]
            for e in events
            if e["reason"] == "Scheduled" and e.get("reportingComponent") == "default-scheduler"
        }
        assert bound == {p["metadata"]["name"] for p in pods}, events

    eventually(scheduler_reported, timeout=TIMEOUT, message="kube-scheduler's Scheduled events")


def test_kubectl_scale_and_delete_are_followed_by_the_controllers(
    control_plane: ClusterAccess, namespace: str, nodes: NodeSet
) -> None:
    kubeconfig = control_plane.kubeconfig_path
    kubectl(kubeconfig, "apply", "-f", "-", namespace=namespace,
            stdin=yaml.safe_dump(deployment("web", 3, nodes.pod_spec_fields())))  # fmt: skip
    eventually(
        lambda: _assert_pods(kubeconfig, namespace, live=3, terminating=0), timeout=TIMEOUT, message="3 pods"
    )

    kubectl(kubeconfig, "scale", "deployment/web", "--replicas=1", namespace=namespace)

    # The ReplicaSet controller deletes two pods; with no kubelet to confirm, they stay Terminating.
    eventually(
        lambda: _assert_pods(kubeconfig, namespace, live=1, terminating=2),
        timeout=TIMEOUT,
        message="scaled to 1",
    )
    (replica_set,) = get(kubeconfig, namespace, "replicasets")
    assert replica_set["spec"]["replicas"] == 1

    kubectl(kubeconfig, "delete", "deployment", "web", namespace=namespace)

    # The garbage collector deletes the ReplicaSet, then its pods.
    def all_gone_or_terminating() -> None:
        assert get(kubeconfig, namespace, "replicasets") == []
        _assert_pods(kubeconfig, namespace, live=0, terminating=3)

    eventually(all_gone_or_terminating, timeout=TIMEOUT, message="garbage collection after the delete")


def _assert_pods(kubeconfig: Path, namespace: str, *, live: int, terminating: int) -> None:
    pods = get(kubeconfig, namespace, "pods")
    deleting = [p for p in pods if p["metadata"].get("deletionTimestamp")]
    assert (len(pods) - len(deleting), len(deleting)) == (live, terminating), [
        (p["metadata"]["name"], p["metadata"].get("deletionTimestamp")) for p in pods
    ]
    assert all(p["spec"].get("nodeName") for p in pods if not p["metadata"].get("deletionTimestamp"))


def test_a_pod_that_does_not_tolerate_a_node_set_is_not_scheduled_there(
    kube_api: ApiClient, namespace: str, nodes: NodeSet
) -> None:
    core = client.CoreV1Api(kube_api)
    pod = client.V1Pod.model_validate(
        {
            "metadata": {"name": "intruder"},
            "spec": {  # selects the set's nodes but does not tolerate their taint
                "nodeSelector": {NODE_SET_KEY: nodes.id},
                "containers": [{"name": "c", "image": "c:1"}],
            },
        }
    )
    core.create_namespaced_pod(namespace, pod)

    def unschedulable() -> str:
        found = core.read_namespaced_pod("intruder", namespace)
        assert found.status is not None
        conditions = {c.type: c for c in found.status.conditions or []}
        assert "PodScheduled" in conditions, "the scheduler has not tried yet"
        assert conditions["PodScheduled"].reason == "Unschedulable"
        return str(conditions["PodScheduled"].message)

    message = eventually(unschedulable, timeout=TIMEOUT, message="the scheduler's verdict")
    assert "untolerated taint" in message
    assert core.read_namespaced_pod("intruder", namespace).spec.node_name is None  # type: ignore[union-attr]


def test_node_set_registers_ready_nodes_with_renewed_leases_and_removes_them(kube_api: ApiClient) -> None:
    core = client.CoreV1Api(kube_api)
    leases = client.CoordinationV1Api(kube_api)
    with NodeSet(kube_api, count=2, renew_interval=3600) as node_set:
        for name in node_set.names:
            node = core.read_node(name)
            assert node.status is not None
            ready = {c.type: c.status for c in node.status.conditions or []}
            assert ready["Ready"] == "True"
            assert node.status.allocatable == node_set.capacity
            assert node.spec is not None
            assert [t.key for t in node.spec.taints or []] == [NODE_SET_KEY]
        first = leases.read_namespaced_lease(node_set.names[0], LEASE_NAMESPACE)
        assert first.spec is not None
        assert first.spec.holder_identity == node_set.names[0]

        node_set.renew()

        renewed = leases.read_namespaced_lease(node_set.names[0], LEASE_NAMESPACE)
        assert renewed.spec is not None
        assert renewed.spec.renew_time != first.spec.renew_time
        assert node_set.renewal_errors == []
    for name in node_set.names:
        assert _status_of(functools.partial(core.read_node, name)) == 404
        assert _status_of(functools.partial(leases.read_namespaced_lease, name, LEASE_NAMESPACE)) == 404


def _status_of(read: Callable[[], object]) -> int:
    """The HTTP status of a read (200 when it succeeds)."""
    try:
        read()
    except ApiException as exc:
        return int(exc.status or 0)
    return 200


def test_a_deleted_namespace_really_goes_away(kube_api: ApiClient) -> None:
    """The namespace controller runs: a namespace with content finishes deleting (envtest's never does)."""
    core = client.CoreV1Api(kube_api)
    name = namespace_name("deleted")
    create_namespace(kube_api, name, TEST_LABEL)
    core.create_namespaced_config_map(name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="content")))

    # Content the controllers add, too. create_namespace waits for the ServiceAccount controller's
    # `default` account only; the root-CA publisher is another controller with its own queue, so its
    # ConfigMap can come later on a loaded machine: wait for it, as for anything asynchronous.
    def root_ca_published() -> None:
        read = functools.partial(core.read_namespaced_config_map, "kube-root-ca.crt", name)
        assert _status_of(read) == 200, f"no kube-root-ca.crt in {name} yet"
        assert "ca.crt" in (read().data or {})

    eventually(root_ca_published, timeout=TIMEOUT, message=f"kube-root-ca.crt published in {name}")

    core.delete_namespace(name)

    def gone() -> None:
        assert _status_of(functools.partial(core.read_namespace, name)) == 404

    eventually(gone, timeout=TIMEOUT, message=f"namespace {name} deleted")
