"""The binaries in use are the pinned releases, and the running plane has what etcd 3.6 brings."""

from __future__ import annotations

import json
import subprocess

import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from harness.cluster.go_binaries import ETCD_VERSION, KUBERNETES_VERSION, binary_path

pytestmark = pytest.mark.integration


def test_etcd_in_use_is_the_pinned_3_6_release() -> None:
    printed = subprocess.run(
        [str(binary_path("etcd")), "--version"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert printed.splitlines()[0] == f"etcd Version: {ETCD_VERSION}"
    assert ETCD_VERSION.startswith("3.6.")


@pytest.mark.parametrize("name", ["kube-apiserver", "kube-scheduler", "kube-controller-manager"])
def test_kubernetes_binaries_in_use_are_the_pinned_release(name: str) -> None:
    printed = subprocess.run(
        [str(binary_path(name)), "--version"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert printed.strip() == f"Kubernetes v{KUBERNETES_VERSION}"


def test_api_server_version_is_the_pinned_release(kube_api: ApiClient) -> None:
    assert client.VersionApi(kube_api).get_code().git_version == f"v{KUBERNETES_VERSION}"


def test_watch_list_streams_initial_events_as_with_a_recent_etcd(kube_api: ApiClient, namespace: str) -> None:
    """kube-apiserver serves ``sendInitialEvents`` watches only when etcd supports RequestWatchProgress
    (>= 3.5.13); with etcd 3.5.1 the same request fails."""
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="seen-first"))
    )
    stream = core.list_namespaced_config_map(
        namespace,
        watch=True,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=10,
        _preload_content=False,
    )
    events = []
    pending = b""
    try:
        for chunk in stream.stream(amt=None):  # type: ignore[attr-defined]
            *lines, pending = (pending + chunk).split(b"\n")
            events += [json.loads(line) for line in lines if line.strip()]
            if events and events[-1]["type"] == "BOOKMARK":
                break
    finally:
        stream.release_conn()  # type: ignore[attr-defined]
    names = [e["object"]["metadata"].get("name") for e in events if e["type"] == "ADDED"]
    assert "seen-first" in names
    assert events[-1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
