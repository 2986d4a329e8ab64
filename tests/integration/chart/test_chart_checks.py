"""The chart's CI checks: ``helm lint --strict``, and every rendered object accepted by a real API server.

``helm template ... | kubectl apply --dry-run=server -f -`` sends each object through the harness's
kube-apiserver (admission, OpenAPI validation, the CRDs' own schemas and CEL rules for the
InferencePool) without persisting it. The chart is rendered with ``deploy/chart/ci/lint-values.yaml``
(two replicas in HA mode, a TLS Secret, a flag and a scheduler threshold) and with the defaults, its
pool in the session's API generation (``inferencePool.apiVersion``: v1 on v1.x CRDs, v1alpha2 on
v0.3.0's). The last case proves the dry run is not a formality: a value the API server refuses is
refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.cluster.controlplane import ClusterAccess
from harness.cluster.helm import Helm, HelmError, chart_dir, lint_values, rendered_kinds
from harness.cluster.kubectl import KubectlError, kubectl
from harness.cluster.releases import V1, session_generation

CHART_KINDS = ["ServiceAccount", "Service", "Deployment", "Role", "RoleBinding", "InferencePool"]
# lint-values.yaml turns HA mode on: a second Role and RoleBinding, for the Lease.
HA_KINDS = ["Role", "RoleBinding"]


def generation_values() -> dict[str, str]:
    """The pool in the session's generation, as the values say it."""
    return {"inferencePool.apiVersion": session_generation().pool_api_version}


@pytest.fixture
def helm(tmp_path: Path) -> Helm:
    return Helm(tmp_path / "helm-home")


def test_helm_lint_strict_passes(helm: Helm) -> None:
    output = helm.lint()
    assert "1 chart(s) linted, 0 chart(s) failed" in output


def test_rendering_without_the_pools_selector_fails_with_a_clear_message(helm: Helm) -> None:
    # (helm lint reports a template's `fail` as [INFO] only: rendering is where a user meets it)
    with pytest.raises(HelmError, match="matchLabels is required"):
        helm.template("vllm-pool", "default")


@pytest.mark.parametrize(
    "values", [pytest.param([lint_values()], id="lint-values"), pytest.param([], id="defaults-with-selector")]
)
def test_every_rendered_object_passes_a_server_side_dry_run(
    helm: Helm, control_plane: ClusterAccess, namespace: str, values: list[Path]
) -> None:
    sets = generation_values()
    if not values:
        sets["inferencePool.modelServers.matchLabels.app"] = "vllm"
    manifest = helm.template("vllm-pool", namespace, values=values, set_values=sets)
    kinds = CHART_KINDS + (HA_KINDS if values else [])
    assert sorted(k.split("/")[0] for k in rendered_kinds(manifest)) == sorted(kinds)
    output = kubectl(control_plane.kubeconfig_path, "apply", "--dry-run=server", "-f", "-", stdin=manifest)
    accepted = [line for line in output.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(kinds), output
    pool = next(line for line in accepted if line.startswith("inferencepool"))
    assert session_generation().pool_group in pool, f"the pool is of the session's generation: {pool}"
    # nothing was persisted
    assert kubectl(control_plane.kubeconfig_path, "get", "deployments,roles", "-o", "name",
                   namespace=namespace).strip() == ""  # fmt: skip


def test_the_dry_run_rejects_what_the_api_server_rejects(
    helm: Helm, control_plane: ClusterAccess, namespace: str
) -> None:
    port = "targetPorts[0].number" if session_generation() is V1 else "targetPortNumber"
    sets = {**generation_values(), f"inferencePool.{port}": "70000"}
    manifest = helm.template("vllm-pool", namespace, values=[lint_values()], set_values=sets)
    with pytest.raises(KubectlError, match=re.escape(port)):
        kubectl(control_plane.kubeconfig_path, "apply", "--dry-run=server", "-f", "-", stdin=manifest)


def test_the_chart_is_this_checkouts(helm: Helm) -> None:
    assert (chart_dir() / "Chart.yaml").is_file()
    assert "name: inferencepool" in (chart_dir() / "Chart.yaml").read_text()
