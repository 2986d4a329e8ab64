"""The control plane through its real API server: version, fixtures, and failed starts with log tails."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from harness import guards
from harness.controlplane import ClusterAccess, ControlPlane, ControlPlaneStartError
from harness.kube_apiserver_build import KUBERNETES_VERSION
from harness.kubectl import kubectl

pytestmark = pytest.mark.integration


def test_kubectl_sees_the_pinned_release(control_plane: ClusterAccess) -> None:
    version = json.loads(kubectl(control_plane.kubeconfig_path, "version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == f"v{KUBERNETES_VERSION}"


def test_namespace_fixture_gives_a_fresh_labelled_namespace(kube_api: ApiClient, namespace: str) -> None:
    found = client.CoreV1Api(kube_api).read_namespace(namespace)
    assert found.status is not None
    assert found.status.phase == "Active"
    assert found.metadata is not None
    assert (found.metadata.labels or {}).get("epp-harness/test") == "true"


def test_admin_is_cluster_admin_under_rbac(kube_api: ApiClient) -> None:
    review = client.AuthorizationV1Api(kube_api).create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(verb="*", resource="*", group="*")
            )
        )
    )
    assert review.status is not None
    assert review.status.allowed


def test_occupied_etcd_port_fails_fast_with_both_log_tails() -> None:
    temp_dirs_before = guards.harness_temp_dirs()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        plane = ControlPlane(etcd_port=port, install_crds=False, start_timeout=60)
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
    plane = ControlPlane(kube_apiserver_binary=broken, install_crds=False, start_timeout=60)
    with pytest.raises(ControlPlaneStartError) as info:
        plane.start()
    message = str(info.value)
    assert "kube-apiserver exited during start (exit code 1)" in message
    assert "simulated broken binary" in message
    assert "--- etcd log" in message
    assert plane.etcd is not None
    assert not plane.etcd.running  # rolled back
    assert guards.harness_temp_dirs() == temp_dirs_before
