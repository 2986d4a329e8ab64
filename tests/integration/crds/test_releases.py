"""Every CRD release the harness takes (`harness.cluster.releases`) installs verbatim into a real API
server and serves its generation's kinds; v1.6.0 gets the objective and rewrite kinds from v1.5.0.

Each release gets a control plane of its own (etcd + kube-apiserver): releases replace one another's
CRDs (v1.0.0 to v1.4.0 still ship the x-k8s InferencePool), which must never happen to the plane the
rest of the suite shares.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes import client

from harness.cluster import crds, releases
from harness.cluster.controlplane import MINIMAL, ControlPlane

pytestmark = pytest.mark.integration

OBJECTIVES = (releases.MODEL_KINDS_GROUP, releases.MODEL_KINDS_VERSION, "inferenceobjectives")
REWRITES = (releases.MODEL_KINDS_GROUP, releases.MODEL_KINDS_VERSION, "inferencemodelrewrites")
MODELS = (releases.V1ALPHA2.pool_group, releases.V1ALPHA2.pool_version, "inferencemodels")


def _served(plane: ControlPlane, group: str, version: str) -> set[str]:
    """The plurals discovery lists for ``group/version`` (subresources left out)."""
    with plane.api_client() as api_client:
        resources = client.CustomObjectsApi(api_client).get_api_resources(group=group, version=version)
    return {r.name for r in resources.resources if "/" not in r.name}


def _expected_kinds(release: str) -> set[tuple[str, str, str]]:
    generation = releases.generation_of(release)
    pools = {(generation.pool_group, generation.pool_version, "inferencepools")}
    if generation is releases.V1ALPHA2:
        return pools | {MODELS}
    rewrites = {REWRITES} if release not in ("v1.0.0", "v1.1.0") else set()  # added in v1.2.0
    return pools | {OBJECTIVES} | rewrites


def _spec_as_served(served: dict[str, Any]) -> dict[str, Any]:
    spec = dict(served["spec"])
    assert spec.pop("conversion") == {"strategy": "None"}  # the API server's default
    return spec


@pytest.mark.parametrize("release", releases.RELEASES)
def test_a_release_installs_verbatim_and_serves_its_generation(release: str) -> None:
    with ControlPlane(components=MINIMAL, crd_release=release) as plane:
        for group, version, plural in _expected_kinds(release):
            assert plural in _served(plane, group, version), f"{release}: {group}/{version} {plural}"
        with plane.api_client() as api_client:
            for path in crds.manifest_paths(release):
                upstream = yaml.safe_load(path.read_text(encoding="utf-8"))
                served = crds.read_crd(api_client, upstream["metadata"]["name"])
                assert _spec_as_served(served) == upstream["spec"], f"{release}: {path.name} changed"


def test_v1_6_0_takes_the_optional_kinds_from_v1_5_0() -> None:
    files = crds.manifest_paths("v1.6.0")
    assert {p.name for p in files} >= set(releases.OPTIONAL_KIND_FILES)
    supplemented = [p for p in files if p.name in releases.OPTIONAL_KIND_FILES]
    assert all(p.parent.name == "v1.5.0" for p in supplemented), supplemented
    own = [p for p in files if p.name not in releases.OPTIONAL_KIND_FILES]
    assert own
    assert all(p.parent.name == "v1.6.0" for p in own)
    assert f"{releases.V1.pool_group}_inferencepools.yaml" in {p.name for p in own}
