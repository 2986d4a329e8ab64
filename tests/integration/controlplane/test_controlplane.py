"""The control plane through its real API server: versions, fixtures, and failed starts with log tails."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from harness.base import guards
from harness.cluster.controlplane import MINIMAL, ClusterAccess, ControlPlane, ControlPlaneStartError
from harness.cluster.go_binaries import KUBERNETES_VERSION
from harness.cluster.kubectl import kubectl

pytestmark = pytest.mark.integration


def test_kubectl_sees_the_pinned_release(control_plane: ClusterAccess) -> None:
    version = json.loads(kubectl(control_plane.kubeconfig_path, "version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == f"v{KUBERNETES_VERSION}"


def test_namespace_fixture_gives_a_fresh_labelled_namespace_ready_for_pods(
    kube_api: ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    found = core.read_namespace(namespace)
    assert found.status is not None
    assert found.status.phase == "Active"
    assert found.metadata is not None
    assert (found.metadata.labels or {}).get("epp-harness/test") == "true"
    # The ServiceAccount controller made it before the fixture returned: admission admits pods at once.
    assert core.read_namespaced_service_account("default", namespace).metadata is not None


def test_occupied_etcd_port_fails_fast_with_both_log_tails() -> None:
    temp_dirs_before = guards.harness_temp_dirs()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        plane = ControlPlane(components=MINIMAL, etcd_port=port, install_crds=False, start_timeout=60)
        with pytest.raises(ControlPlaneStartError) as info:
            plane.start()
    message = str(info.value)
    assert "etcd exited during start" in message  # detected by exit, not by waiting for the timeout
    assert "address already in use" in message
    assert "--- etcd log" in message
    assert "--- kube-apiserver log" in message
    assert plane.root is None
    assert guards.harness_temp_dirs() == temp_dirs_before


def test_broken_apiserver_binary_fails_fast_and_rolls_back_etcd(tmp_path: Path) -> None:
    broken = tmp_path / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'kube-apiserver: simulated broken binary' >&2\nexit 1\n")
    broken.chmod(0o755)
    temp_dirs_before = guards.harness_temp_dirs()
    plane = ControlPlane(binaries={"kube-apiserver": broken}, install_crds=False, start_timeout=60)
    with pytest.raises(ControlPlaneStartError) as info:
        plane.start()
    message = str(info.value)
    assert "kube-apiserver exited during start (exit code 1)" in message
    assert "simulated broken binary" in message
    assert "--- etcd log" in message
    assert "--- kube-controller-manager log" in message  # every component of the plane is reported
    assert plane.etcd is not None
    assert not plane.etcd.running  # rolled back
    assert plane.scheduler is None  # never launched: it needs the API server
    assert guards.harness_temp_dirs() == temp_dirs_before


def test_a_broken_controller_manager_fails_fast_and_rolls_back_the_rest(tmp_path: Path) -> None:
    broken = tmp_path / "kube-controller-manager"
    broken.write_text("#!/bin/sh\necho 'controller-manager: simulated broken binary' >&2\nexit 2\n")
    broken.chmod(0o755)
    temp_dirs_before = guards.harness_temp_dirs()
    plane = ControlPlane(binaries={"kube-controller-manager": broken}, install_crds=False)
    with pytest.raises(ControlPlaneStartError) as info:
        plane.start()
    message = str(info.value)
    assert "kube-controller-manager exited during start (exit code 2)" in message
    assert "simulated broken binary" in message
    assert all(not p.running for p in plane.processes)
    assert [p.name for p in plane.processes] == list(plane.components)
    assert guards.harness_temp_dirs() == temp_dirs_before
