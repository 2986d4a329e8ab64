"""Fetching upstream's CRD manifests into the harness cache (the Go download is faked here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.cluster import crds, gobuild

CRD = b"""---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true}]
"""


@pytest.fixture
def fake_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A module per release under ``tmp_path/modules``; returns the downloads asked for."""
    monkeypatch.setenv("EPP_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(crds.CRD_RELEASE_ENV, raising=False)
    asked: list[str] = []

    def download(module_at_version: str) -> dict[str, Any]:
        asked.append(module_at_version)
        release = module_at_version.rsplit("@", 1)[1]
        directory = tmp_path / "modules" / release
        bases = directory / "config" / "crd" / "bases"
        if release != "v1.3.0":  # the one release faked with no manifests
            bases.mkdir(parents=True, exist_ok=True)
            (bases / "example.com_widgets.yaml").write_bytes(CRD.replace(b"v1", release.encode()[:2]))
        return {"Dir": str(directory)}

    monkeypatch.setattr(gobuild, "download_module", download)
    return asked


def test_manifests_are_fetched_once_and_kept_byte_for_byte(fake_module: list[str], tmp_path: Path) -> None:
    paths = crds.manifest_paths()
    assert paths == [tmp_path / "cache/crds/gateway-api-inference-extension/v0.3.0/example.com_widgets.yaml"]
    assert (
        paths[0].read_bytes()
        == (tmp_path / "modules/v0.3.0/config/crd/bases/example.com_widgets.yaml").read_bytes()
    )
    assert crds.manifest_paths() == paths
    assert fake_module == ["sigs.k8s.io/gateway-api-inference-extension@v0.3.0"]
    assert [m["metadata"]["name"] for m in crds.load_crd_manifests()] == ["widgets.example.com"]


def test_another_release_is_selected_by_argument_or_environment(
    fake_module: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert crds.manifest_paths("v1.2.0")[0].parent.name == "v1.2.0"
    monkeypatch.setenv(crds.CRD_RELEASE_ENV, "v1.4.0")
    assert crds.manifest_paths()[0].parent.name == "v1.4.0"
    assert fake_module == [f"{crds.CRD_MODULE}@v1.2.0", f"{crds.CRD_MODULE}@v1.4.0"]


def test_a_release_without_manifests_is_an_error_and_caches_nothing(
    fake_module: list[str], tmp_path: Path
) -> None:
    with pytest.raises(crds.CrdInstallError, match="has no config/crd/bases"):
        crds.manifest_paths("v1.3.0")
    assert not (tmp_path / "cache/crds/gateway-api-inference-extension/v1.3.0").exists()


def test_leaving_out_a_crd_the_release_does_not_have_is_an_error_before_any_request(
    fake_module: list[str],
) -> None:
    """A misspelt name in ``without`` would install everything and hide the typo: it is refused."""
    no_server: Any = None  # the check comes before the first request
    with pytest.raises(crds.CrdInstallError, match=r"not CRDs of v0.3.0: \['gadgets.example.com'\]"):
        crds.install_crds(no_server, without=["widgets.example.com", "gadgets.example.com"])
