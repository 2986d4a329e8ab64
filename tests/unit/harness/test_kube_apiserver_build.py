"""kube-apiserver resolution and the pure parts of the build recipe (no Go toolchain run here)."""

from __future__ import annotations

import datetime as dt
import io
import os
import threading
from pathlib import Path

import pytest

from harness import kube_apiserver_build as kab
from harness.binaries import BinaryNotFoundError
from harness.eventually import eventually

KK_GO_MOD = """\
// This is a generated file. Do not edit directly.
module k8s.io/kubernetes

go 1.26.0

godebug default=go1.26

require (
\tgithub.com/blang/semver/v4 v4.0.0
\tk8s.io/api v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/cri-streaming => ./staging/src/k8s.io/cri-streaming
\tgithub.com/example/fork => github.com/example/fork v1.2.3
)

replace k8s.io/streaming => ./staging/src/k8s.io/streaming
"""


def test_staging_modules_are_derived_from_the_replace_lines() -> None:
    assert kab.staging_modules(KK_GO_MOD) == ["k8s.io/api", "k8s.io/cri-streaming", "k8s.io/streaming"]


def test_wrapper_go_mod_copies_go_and_godebug_and_pins_staging_modules() -> None:
    text = kab.wrapper_go_mod(KK_GO_MOD, "1.36.3")
    assert text.splitlines()[:5] == [
        f"module {kab.WRAPPER_MODULE}",
        "",
        "go 1.26.0",
        "",
        "godebug default=go1.26",
    ]
    assert "require k8s.io/kubernetes v1.36.3" in text
    for module in ("k8s.io/api", "k8s.io/cri-streaming", "k8s.io/streaming"):
        assert f"\t{module} => {module} v0.36.3" in text
    assert "github.com/example/fork" not in text


def test_wrapper_go_mod_refuses_a_go_mod_without_staging_replaces() -> None:
    with pytest.raises(kab.KubeApiserverBuildError, match=r"no '\./staging/src"):
        kab.wrapper_go_mod("module x\n\ngo 1.26.0\n", "1.36.3")


def test_real_kubernetes_go_mod_if_cached() -> None:
    cached = Path(os.environ.get("GOMODCACHE", Path.home() / "go/pkg/mod")) / (
        f"cache/download/k8s.io/kubernetes/@v/v{kab.KUBERNETES_VERSION}.mod"
    )
    if not cached.is_file():
        pytest.skip("k8s.io/kubernetes go.mod not in the Go module cache")
    modules = kab.staging_modules(cached.read_text())
    assert len(modules) == 33  # 1.36: the 31 of 1.32-1.35 plus cri-streaming and streaming
    assert {"k8s.io/api", "k8s.io/client-go", "k8s.io/cri-streaming", "k8s.io/streaming"} <= set(modules)


def test_version_ldflags_stamp_both_version_packages() -> None:
    flags = kab.version_ldflags("1.36.3", dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    assert flags.startswith("-s -w ")
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        for setting in (
            "gitVersion=v1.36.3",
            "gitMajor=1",
            "gitMinor=36",
            "gitTreeState=clean",
            "buildDate=2026-01-02T03:04:05Z",
        ):
            assert f"-X {package}.{setting}" in flags


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("go version go1.26.8 linux/amd64", (1, 26, 8), id="release"),
        pytest.param("go version go1.19 linux/amd64", (1, 19, 0), id="no-patch"),
        pytest.param("1.26.0", None, id="bare-directive-needs-go-prefix"),
        pytest.param("go1.26.0", (1, 26, 0), id="directive"),
    ],
)
def test_parse_go_version(text: str, expected: tuple[int, int, int] | None) -> None:
    assert kab.parse_go_version(text) == expected


def test_missing_go_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `go` anywhere
    with pytest.raises(kab.GoToolchainMissingError) as info:
        kab._require_go((1, 26))
    message = str(info.value)
    assert "install Go >= 1.26" in message
    assert "apt-get install golang-go is too old" in message
    assert "KUBEBUILDER_ASSETS" in message


def test_too_old_go_says_what_to_install(tmp_path: Path) -> None:
    fake_go = tmp_path / "go"
    fake_go.write_text("#!/bin/sh\necho 'go version go1.19.8 linux/amd64'\n")
    fake_go.chmod(0o755)
    with pytest.raises(kab.GoToolchainMissingError, match=r"too old .*install Go >= 1\.26"):
        kab._require_go((1, 26), str(fake_go))


def test_kubebuilder_assets_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "kube-apiserver"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.delenv("TEST_ASSET_KUBE_APISERVER", raising=False)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    assert kab.ensure_kube_apiserver() == kab.EnsureResult(binary, "env")


def test_kubebuilder_assets_without_the_binary_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_ASSET_KUBE_APISERVER", raising=False)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    with pytest.raises(BinaryNotFoundError, match="no executable kube-apiserver"):
        kab.ensure_kube_apiserver()


def test_cache_hit_builds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_ASSET_KUBE_APISERVER", raising=False)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("EPP_HARNESS_CACHE", str(tmp_path))
    cached = tmp_path / "kube-apiserver" / "v9.9.9" / "kube-apiserver"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    cached.chmod(0o755)

    def no_build(*args: object) -> None:
        raise AssertionError("must not build")

    monkeypatch.setattr(kab, "build_kube_apiserver", no_build)
    assert kab.ensure_kube_apiserver("9.9.9") == kab.EnsureResult(cached, "cache")


def test_concurrent_callers_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_ASSET_KUBE_APISERVER", raising=False)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("EPP_HARNESS_CACHE", str(tmp_path))
    builds: list[Path] = []
    inside = threading.Event()
    release = threading.Event()

    def fake_build(target: Path, version: str, out: object) -> None:
        builds.append(target)
        inside.set()
        assert release.wait(10)
        target.write_text("#!/bin/sh\n")
        target.chmod(0o755)

    monkeypatch.setattr(kab, "build_kube_apiserver", fake_build)
    results: list[kab.EnsureResult] = []
    first = threading.Thread(target=lambda: results.append(kab.ensure_kube_apiserver("9.9.9", io.StringIO())))
    first.start()
    assert inside.wait(10)
    waiting = io.StringIO()
    second = threading.Thread(target=lambda: results.append(kab.ensure_kube_apiserver("9.9.9", waiting)))
    second.start()
    eventually(lambda: _assert_in("another process is building", waiting.getvalue()))
    release.set()
    first.join()
    second.join()
    assert len(builds) == 1
    assert sorted(r.source for r in results) == ["built", "cache"]


def _assert_in(needle: str, haystack: str) -> None:
    assert needle in haystack
