"""The kind backend (``harness.cluster.kind``): kind from Go modules, a node image built here, a cluster.

Container tier (opt-in). The test runs every step it can; where a step cannot be done on this machine
(no registry: see ``KindCluster``) it skips with the step, the command and the tool's own error, so the
reason is in the report rather than a silent pass. Where the cluster does come up, its nodes must be
Ready and our images loaded into it.
"""

from __future__ import annotations

import json
import os

import pytest

from harness.cluster.container_engine import DockerEngine
from harness.cluster.kind import KindCluster, KindUnavailable
from harness.cluster.kubectl import kubectl
from harness.nodeagent.image_builds import BuiltImages

pytestmark = [pytest.mark.e2e, pytest.mark.containers, pytest.mark.timeout(1800)]

KIND_ENV = "EPP_HARNESS_KIND"


def test_a_kind_cluster_of_a_node_image_built_here_runs_our_images(
    container_engine: DockerEngine, epp_image: BuiltImages
) -> None:
    if os.environ.get(KIND_ENV, "") in ("", "0"):
        pytest.skip(
            f"opt-in ({KIND_ENV}=1): the node image needs kubeadm, kubelet and kube-proxy built from Go "
            "modules (minutes); README 'The container tier' says where it stops on this machine"
        )
    cluster = KindCluster(container_engine, name="epp-harness-test")
    try:
        try:
            cluster.start()
            cluster.load_images([epp_image.tag])
        except KindUnavailable as exc:
            pytest.skip(f"kind backend not available here: {exc}")
        nodes = json.loads(kubectl(cluster.kubeconfig, "get", "nodes", "-o", "json"))["items"]
        assert nodes, "the kind cluster has no nodes"
        for node in nodes:
            ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
            assert ready == "True", node["metadata"]["name"]
    finally:
        cluster.stop()
