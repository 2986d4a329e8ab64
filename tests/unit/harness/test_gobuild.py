"""Go-built binaries: resolution like envtest, the version pin, the build lock, and the pure parts of
the recipes (no Go toolchain runs here)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.base.binaries import BinaryNotFoundError
from harness.base.eventually import eventually
from harness.cluster import go_binaries, gobuild
from harness.cluster.gobuild import BuildContext, GoBinary, GoBuild, Resolved

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

TOOL = GoBinary("tool", "example.com/tool/cmd/tool", ("--version",), "tool v9.9.9")
OTHER = GoBinary("other", "example.com/tool/cmd/other", ("version",), "other 9.9.9")
BUILD = GoBuild(name="tools", module="example.com/tool", version="9.9.9", binaries=(TOOL, OTHER))


def _context(go_mod: str = KK_GO_MOD, version: str = "1.36.3", commit: str | None = None) -> BuildContext:
    return BuildContext(version, go_mod, commit, dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty harness cache, no overrides, and no /usr/local/kubebuilder/bin to find."""
    for binary in (TOOL, OTHER):
        monkeypatch.delenv(binary.env_var, raising=False)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setattr(gobuild, "DEFAULT_ASSETS_DIR", tmp_path / "no-kubebuilder")
    cache = tmp_path / "cache"
    monkeypatch.setenv("EPP_HARNESS_CACHE", str(cache))
    return cache


def _script(path: Path, output: str) -> Path:
    """An executable that prints ``output`` whatever its arguments (a stand-in binary)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)
    return path


# --------------------------------------------------------------------------- pure parts


def test_staging_modules_are_derived_from_the_replace_lines() -> None:
    assert go_binaries.staging_modules(KK_GO_MOD) == [
        "k8s.io/api",
        "k8s.io/cri-streaming",
        "k8s.io/streaming",
    ]


def test_kubernetes_wrapper_go_mod_copies_go_and_godebug_and_pins_staging_modules() -> None:
    text = gobuild.wrapper_go_mod(go_binaries.KUBERNETES, _context())
    assert text.splitlines()[:5] == [
        "module example.invalid/kubernetes-build",
        "",
        "go 1.26.0",
        "",
        "godebug default=go1.26",
    ]
    assert "require k8s.io/kubernetes v1.36.3" in text
    for module in ("k8s.io/api", "k8s.io/cri-streaming", "k8s.io/streaming"):
        assert f"\t{module} => {module} v0.36.3" in text
    assert "github.com/example/fork" not in text


def test_kubernetes_wrapper_refuses_a_go_mod_without_staging_replaces() -> None:
    with pytest.raises(gobuild.GoBuildError, match=r"no '\./staging/src"):
        gobuild.wrapper_go_mod(go_binaries.KUBERNETES, _context("module x\n\ngo 1.26.0\n"))


def test_plain_wrapper_go_mod_only_requires_the_module() -> None:
    text = gobuild.wrapper_go_mod(go_binaries.ETCD, _context("module go.etcd.io/etcd/server/v3\n\ngo 1.24\n"))
    assert text.split("\n") == [
        "module example.invalid/etcd-build",
        "",
        "go 1.24",
        "",
        f"require go.etcd.io/etcd/server/v3 v{go_binaries.ETCD_VERSION}",
        "",
    ]


def test_real_kubernetes_go_mod_if_cached() -> None:
    cached = Path(os.environ.get("GOMODCACHE", Path.home() / "go/pkg/mod")) / (
        f"cache/download/k8s.io/kubernetes/@v/v{go_binaries.KUBERNETES_VERSION}.mod"
    )
    if not cached.is_file():
        pytest.skip("k8s.io/kubernetes go.mod not in the Go module cache")
    modules = go_binaries.staging_modules(cached.read_text())
    assert len(modules) == 33  # 1.36: the 31 of 1.32-1.35 plus cri-streaming and streaming
    assert {"k8s.io/api", "k8s.io/client-go", "k8s.io/cri-streaming", "k8s.io/streaming"} <= set(modules)


def test_kubernetes_ldflags_stamp_both_version_packages_and_the_commit_when_known() -> None:
    flags = go_binaries.kubernetes_ldflags(_context(commit="abc123"))
    assert flags.startswith("-s -w ")
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        for setting in (
            "gitVersion=v1.36.3",
            "gitMajor=1",
            "gitMinor=36",
            "gitTreeState=clean",
            "buildDate=2026-01-02T03:04:05Z",
            "gitCommit=abc123",
        ):
            assert f"-X {package}.{setting}" in flags
    assert "gitCommit" not in go_binaries.kubernetes_ldflags(_context())


def test_etcd_ldflags_stamp_the_short_commit_when_known() -> None:
    assert go_binaries.etcd_ldflags(_context(commit="0123456789abcdef")) == (
        "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=0123456"
    )
    assert go_binaries.etcd_ldflags(_context()) == "-s -w"


@pytest.mark.parametrize(
    ("package", "name"),
    [
        pytest.param("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver", id="last-element"),
        pytest.param("go.etcd.io/etcd/server/v3", "server", id="major-version-suffix"),
        pytest.param("helm.sh/helm/v3/cmd/helm", "helm", id="suffix-in-the-middle"),
    ],
)
def test_default_executable_name(package: str, name: str) -> None:
    assert gobuild.default_executable_name(package) == name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("go version go1.26.8 linux/amd64", (1, 26, 8), id="release"),
        pytest.param("go version go1.19 linux/amd64", (1, 19, 0), id="no-patch"),
        pytest.param("1.26.0", (1, 26, 0), id="bare-go-directive"),
        pytest.param("1.24", (1, 24, 0), id="bare-go-directive-no-patch"),
        pytest.param("go1.26.0", (1, 26, 0), id="prefixed"),
        pytest.param("no version here", None, id="none"),
    ],
)
def test_parse_go_version(text: str, expected: tuple[int, int, int] | None) -> None:
    assert gobuild.parse_go_version(text) == expected


def test_go_directive_is_checked_against_the_toolchain(tmp_path: Path) -> None:
    """The go directive of the upstream go.mod ("go 1.26.0", no "go" prefix) really gates the build."""
    fake_go = _script(tmp_path / "go", "go version go1.25.3 linux/amd64")
    required = gobuild.parse_go_version(gobuild.go_directive(KK_GO_MOD))
    assert required == (1, 26, 0)
    with pytest.raises(gobuild.GoToolchainMissingError, match=r"too old .*install Go >= 1\.26"):
        gobuild.require_go(required[:2], str(fake_go))


def test_missing_go_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `go` anywhere
    with pytest.raises(gobuild.GoToolchainMissingError) as info:
        gobuild.require_go((1, 26))
    message = str(info.value)
    assert "install Go >= 1.26" in message
    assert "apt-get install golang-go is too old" in message
    assert "KUBEBUILDER_ASSETS" in message


def test_every_pinned_binary_has_an_envtest_style_override() -> None:
    names = {b.name: b.env_var for build in go_binaries.BUILDS for b in build.binaries}
    assert names == {
        "etcd": "TEST_ASSET_ETCD",
        "kube-apiserver": "TEST_ASSET_KUBE_APISERVER",
        "kube-scheduler": "TEST_ASSET_KUBE_SCHEDULER",
        "kube-controller-manager": "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
    }


# --------------------------------------------------------------------------- resolution


def test_test_asset_variable_wins_and_is_version_checked(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _script(tmp_path / "bin" / "my-tool", "tool v9.9.9")
    monkeypatch.setenv("TEST_ASSET_TOOL", str(binary))
    assert gobuild.find(BUILD, TOOL) == Resolved(binary, "env")


def test_kubebuilder_assets_provides_what_it_has(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = tmp_path / "assets"
    binary = _script(assets / "tool", "tool v9.9.9")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    assert gobuild.find(BUILD, TOOL) == Resolved(binary, "assets")
    assert gobuild.find(BUILD, OTHER) is None  # not there: the cache (or a build) provides it


def test_a_kubebuilder_assets_binary_of_another_version_is_refused_with_a_clear_message(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = tmp_path / "assets"
    _script(assets / "tool", "tool v1.0.0")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    with pytest.raises(gobuild.BinaryVersionError) as info:
        gobuild.find(BUILD, TOOL)
    message = str(info.value)
    assert "reports 'tool v1.0.0'" in message
    assert "pins example.com/tool v9.9.9" in message
    assert "TEST_ASSET_TOOL or KUBEBUILDER_ASSETS" in message


def test_a_missing_kubebuilder_assets_directory_is_an_error(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path / "nowhere"))
    with pytest.raises(BinaryNotFoundError, match="is not a directory"):
        gobuild.find(BUILD, TOOL)


def test_a_test_asset_variable_naming_nothing_is_an_error(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_ASSET_TOOL", str(tmp_path / "nothing"))
    with pytest.raises(BinaryNotFoundError, match="no executable tool"):
        gobuild.find(BUILD, TOOL)


def test_the_default_kubebuilder_directory_is_probed_and_skipped_on_another_version(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = tmp_path / "usr-local-kubebuilder-bin"
    monkeypatch.setattr(gobuild, "DEFAULT_ASSETS_DIR", default)
    good = _script(default / "tool", "tool v9.9.9")
    _script(default / "other", "other 1.0.0")
    note = io.StringIO()
    assert gobuild.find(BUILD, TOOL, note) == Resolved(good, "assets")
    assert gobuild.find(BUILD, OTHER, note) is None
    assert "note: skipping" in note.getvalue()


def test_cache_hit_builds_nothing(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for binary in BUILD.binaries:
        _script(clean_env / binary.name / "v9.9.9" / binary.name, binary.version_output)

    def no_build(*args: object) -> None:
        raise AssertionError("must not build")

    monkeypatch.setattr(gobuild, "build_binaries", no_build)
    assert gobuild.ensure(BUILD) == {
        "tool": Resolved(clean_env / "tool" / "v9.9.9" / "tool", "cache"),
        "other": Resolved(clean_env / "other" / "v9.9.9" / "other", "cache"),
    }


def test_only_missing_binaries_are_built_and_concurrent_callers_build_once(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(clean_env / "tool" / "v9.9.9" / "tool", "tool v9.9.9")  # cached already
    builds: list[list[str]] = []
    inside = threading.Event()
    release = threading.Event()

    def fake_build(build: GoBuild, binaries: Sequence[GoBinary], out: object) -> None:
        builds.append([b.name for b in binaries])
        inside.set()
        assert release.wait(10)
        for binary in binaries:
            _script(gobuild.cached_path(build, binary), binary.version_output)

    monkeypatch.setattr(gobuild, "build_binaries", fake_build)
    results: list[dict[str, Resolved]] = []
    first = threading.Thread(target=lambda: results.append(gobuild.ensure(BUILD, io.StringIO())))
    first.start()
    assert inside.wait(10)
    waiting = io.StringIO()
    second = threading.Thread(target=lambda: results.append(gobuild.ensure(BUILD, waiting)))
    second.start()
    eventually(lambda: _assert_in("another process is building tools v9.9.9", waiting.getvalue()))
    release.set()
    first.join()
    second.join()
    assert builds == [["other"]]
    sources = sorted((r["tool"].source, r["other"].source) for r in results)
    assert sources == [("cache", "built"), ("cache", "cache")]


def test_a_new_binary_is_a_declaration() -> None:
    """What adding helm or the upstream EPP takes: data, resolved through the same plumbing."""
    helm = GoBuild(
        name="helm",
        module="helm.sh/helm/v3",
        version="3.17.0",
        binaries=(GoBinary("helm", "helm.sh/helm/v3/cmd/helm", ("version", "--short"), "v3.17.0"),),
    )
    assert helm.binaries[0].env_var == "TEST_ASSET_HELM"
    assert gobuild.cached_path(helm, helm.binaries[0]).parts[-3:] == ("helm", "v3.17.0", "helm")
    assert dataclasses.replace(helm, version="3.18.0").version == "3.18.0"


def _assert_in(needle: str, haystack: str) -> None:
    assert needle in haystack


# --------------------------------------------------------------------------- build info (no version flag)


def _build_info_blob(module_info: str, go_version: str = "go1.26.8") -> bytes:
    """Bytes laid out as Go >= 1.18 embeds build info: 32-byte header, then two uvarint strings."""

    def uvarint_string(text: str) -> bytes:
        data = text.encode()
        length, out = len(data), bytearray()
        while length >= 0x80:
            out.append((length & 0x7F) | 0x80)
            length >>= 7
        out.append(length)
        return bytes(out) + data

    header = b"\xff Go buildinf:" + bytes([8, 0x2]) + bytes(16)
    sentinel = bytes(16)
    wrapped = sentinel.decode("latin-1") + module_info + sentinel.decode("latin-1")
    return b"\x7fELF" + bytes(100) + header + uvarint_string(go_version) + uvarint_string(wrapped) + bytes(50)


UPSTREAM_INFO = (
    "path\tsigs.k8s.io/gateway-api-inference-extension/cmd/epp\n"
    "mod\tsigs.k8s.io/gateway-api-inference-extension\tv0.3.0\th1:abc=\n"
    "dep\tgithub.com/go-logr/logr\tv1.4.2\th1:def=\n" + "dep\texample.com/filler\tv1.0.0\th1:x=\n" * 20
)


def test_build_info_is_read_without_running_the_binary() -> None:
    info = gobuild.parse_build_info(
        b"not go\xff Go buildinf: but no header" + _build_info_blob(UPSTREAM_INFO)
    )
    assert info == UPSTREAM_INFO
    assert gobuild.parse_build_info(b"\x7fELF nothing here") == ""


def test_real_go_binary_build_info_if_cached() -> None:
    etcd = gobuild.cached_path(go_binaries.ETCD, go_binaries.ETCD.binaries[0])
    if not etcd.is_file():
        pytest.skip("etcd not in the harness cache")
    info = gobuild.parse_build_info(etcd.read_bytes())
    assert f"mod\tgo.etcd.io/etcd/server/v3\tv{go_binaries.ETCD_VERSION}\t" in info


def test_the_upstream_epp_is_pinned_by_its_build_info(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = go_binaries.upstream_epp_build("v0.3.0")
    binary = build.binaries[0]
    assert (build.module, build.version, binary.package) == (
        "sigs.k8s.io/gateway-api-inference-extension",
        "0.3.0",
        "sigs.k8s.io/gateway-api-inference-extension/cmd/epp",
    )
    assert binary.env_var == "TEST_ASSET_UPSTREAM_EPP"
    assert gobuild.cached_path(build, binary).parts[-3:] == ("upstream-epp", "v0.3.0", "upstream-epp")
    assert all(b.name != "upstream-epp" for b in go_binaries.BUILDS for b in b.binaries)  # on request only

    good = tmp_path / "good-epp"
    good.write_bytes(_build_info_blob(UPSTREAM_INFO))
    good.chmod(0o755)
    monkeypatch.setenv("TEST_ASSET_UPSTREAM_EPP", str(good))
    assert gobuild.find(build, binary) == Resolved(good, "env")

    other = tmp_path / "other-epp"
    other.write_bytes(_build_info_blob(UPSTREAM_INFO.replace("v0.3.0", "v0.4.0")))
    other.chmod(0o755)
    monkeypatch.setenv("TEST_ASSET_UPSTREAM_EPP", str(other))
    with pytest.raises(
        gobuild.BinaryVersionError, match=r"pins sigs\.k8s\.io/gateway-api-inference-extension v0\.3\.0"
    ):
        gobuild.find(build, binary)


@pytest.mark.parametrize(
    ("flags", "built", "line"),
    [
        pytest.param(
            ["--upstream-epp", "v0.3.0"],
            "upstream-epp@0.3.0",
            "upstream-epp             v0.3.0",
            id="upstream-epp",
        ),
        pytest.param(["--helm"], "helm@3.19.0", "helm                     v3.19.0", id="helm"),
    ],
)
def test_harness_build_builds_an_optional_binary_only_when_asked(
    clean_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    built: str,
    line: str,
) -> None:
    ensured: list[str] = []

    def fake_ensure(build: GoBuild, progress: object = None) -> dict[str, Resolved]:
        ensured.append(f"{build.name}@{build.version}")
        return {b.name: Resolved(gobuild.cached_path(build, b), "cache") for b in build.binaries}

    monkeypatch.setattr(gobuild, "ensure", fake_ensure)
    assert go_binaries.main([]) == 0
    assert built not in ensured
    ensured.clear()
    assert go_binaries.main(flags) == 0
    assert ensured[-1] == built
    assert line in capsys.readouterr().out


def test_helm_is_stamped_as_its_makefile_does() -> None:
    go_mod = "module helm.sh/helm/v3\n\ngo 1.24.0\n\nrequire (\n\tk8s.io/client-go v0.34.0\n)\n"
    context = dataclasses.replace(_context(commit="abc123"), version="3.19.0", upstream_go_mod=go_mod)
    flags = go_binaries.helm_ldflags(context)
    assert "-X helm.sh/helm/v3/internal/version.version=v3.19.0" in flags
    assert "-X helm.sh/helm/v3/internal/version.gitCommit=abc123" in flags
    for package in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        assert f"-X {package}.k8sVersionMajor=1" in flags
        assert f"-X {package}.k8sVersionMinor=34" in flags
    helm = go_binaries.HELM.binary("helm")
    assert (helm.env_var, helm.version_args, helm.version_output) == (
        "TEST_ASSET_HELM",
        ("version", "--short"),
        "v3.19.0",
    )


def test_a_pre_modules_release_gets_the_declared_go_directive_and_its_pinned_dependencies() -> None:
    synthesised = "module github.com/summerwind/h2spec\n"  # what the proxy serves for +incompatible
    context = BuildContext(
        go_binaries.H2SPEC_VERSION, synthesised, None, dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    )
    wrapper = gobuild.wrapper_go_mod(go_binaries.H2SPEC, context)
    assert "\ngo 1.21\n" in wrapper
    assert "require github.com/summerwind/h2spec v2.2.1+incompatible" in wrapper
    assert "\tgolang.org/x/net v0.62.0" in wrapper
    with pytest.raises(gobuild.GoBuildError, match="no 'go' directive"):  # without legacy_go: still an error
        gobuild.wrapper_go_mod(dataclasses.replace(go_binaries.H2SPEC, legacy_go=""), context)
    real = "module example.com/m\n\ngo 1.24.0\n"
    assert gobuild.upstream_go_directive(go_binaries.H2SPEC, real) == "1.24.0"  # a real one wins
