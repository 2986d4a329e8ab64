"""The CRDs in the cluster are upstream's own files of the session's release, unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiClient

from harness.cluster import crds, gobuild

pytestmark = pytest.mark.integration


def test_cached_manifests_are_the_module_files_byte_for_byte() -> None:
    release = crds.default_release()
    module_dir = gobuild.download_module(f"{crds.CRD_MODULE}@{release}")["Dir"]
    upstream = sorted((Path(module_dir) / "config/crd/bases").glob("*.yaml"))
    cached = crds.manifest_paths(release)[: len(upstream)]  # (then any supplement: test_releases.py)
    assert [p.name for p in cached] == [p.name for p in upstream]
    assert [p.read_bytes() for p in cached] == [p.read_bytes() for p in upstream]


def test_installed_crds_equal_the_upstream_files_after_parsing(kube_api: ApiClient) -> None:
    for path in crds.manifest_paths(crds.default_release()):
        upstream = yaml.safe_load(path.read_text(encoding="utf-8"))
        served = crds.read_crd(kube_api, upstream["metadata"]["name"])

        spec = dict(served["spec"])
        assert spec.pop("conversion") == {"strategy": "None"}  # the API server's default
        assert "conversion" not in upstream["spec"]
        assert spec == upstream["spec"]
        assert (served["apiVersion"], served["kind"]) == (upstream["apiVersion"], upstream["kind"])
        assert served["metadata"]["annotations"] == upstream["metadata"]["annotations"]
        assert served["metadata"].get("labels") == upstream["metadata"].get("labels")
