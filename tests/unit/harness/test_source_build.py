"""``harness build --epp-source DIR``: the cache name of a checkout (module path + commit or content
hash), the checkout left untouched, and a real ``go build`` of a tiny module when Go is installed;
``--upstream-epp`` picks ``./cmd/lwepp`` from v1.6.0."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.cluster import go_binaries, gobuild, source_build
from harness.subject import flag_profiles
from harness.subject.foreign_epp import EppCommand

MODULE = "example.com/some-router"
GO_MOD = f"module {MODULE}\n\ngo 1.21\n"
MAIN = 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("an EPP") }\n'


def _checkout(root: Path) -> Path:
    (root / "cmd" / "epp").mkdir(parents=True)
    (root / "go.mod").write_text(GO_MOD)
    (root / "cmd" / "epp" / "main.go").write_text(MAIN)
    return root


def _git(directory: Path, *args: str) -> str:
    run = subprocess.run(
        ["git", "-C", str(directory), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return run.stdout.strip()


@pytest.mark.parametrize(
    ("go_mod", "module"),
    [
        pytest.param(
            "module github.com/llm-d/llm-d-router\n\ngo 1.26.6\n", "github.com/llm-d/llm-d-router", id="plain"
        ),
        pytest.param('// c\nmodule "example.com/q"\n', "example.com/q", id="quoted"),
    ],
)
def test_the_module_path_is_read_from_go_mod(go_mod: str, module: str) -> None:
    assert source_build.module_path(go_mod) == module


def test_a_go_mod_without_a_module_line_is_refused() -> None:
    with pytest.raises(gobuild.GoBuildError, match="no 'module' line"):
        source_build.module_path("go 1.21\n")


def test_a_directory_outside_git_is_named_by_its_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPP_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # never the enclosing repository
    checkout = _checkout(tmp_path / "src")
    first = source_build.revision_of(checkout)
    assert first.module == MODULE
    assert first.revision.startswith("tree-")
    assert len(first.revision) == len("tree-") + 12
    assert source_build.cached_path(first).parts[-4:] == (
        "epp-source", "example.com+some-router", first.revision, "epp",
    )  # fmt: skip
    assert source_build.revision_of(checkout) == first  # stable
    (checkout / ".git").mkdir()  # not a repository, and not content: ignored
    (checkout / ".git" / "junk").write_text("x")
    assert source_build.revision_of(checkout) == first
    (checkout / "cmd" / "epp" / "main.go").write_text(MAIN.replace("an EPP", "another EPP"))
    assert source_build.revision_of(checkout).revision != first.revision


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_git_checkout_is_named_by_its_commit_and_marked_dirty_by_local_changes(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path / "src")
    _git(checkout, "init", "-q")
    _git(checkout, "add", ".")
    _git(checkout, "commit", "-q", "-m", "x")
    commit = _git(checkout, "rev-parse", "HEAD")
    assert source_build.revision_of(checkout).revision == f"git-{commit}"
    (checkout / "cmd" / "epp" / "extra.go").write_text("package main\n")
    dirty = source_build.revision_of(checkout).revision
    assert dirty.startswith(f"git-{commit}-dirty-")
    (checkout / "cmd" / "epp" / "extra.go").write_text("package main\n\n")
    assert source_build.revision_of(checkout).revision not in (dirty, f"git-{commit}")


def test_a_directory_without_cmd_epp_is_refused(tmp_path: Path) -> None:
    (tmp_path / "go.mod").write_text(GO_MOD)
    with pytest.raises(gobuild.GoBuildError, match="has no cmd/epp"):
        source_build.build_from_source(tmp_path, io.StringIO())


@pytest.mark.skipif(shutil.which("go") is None, reason="Go is not installed")
def test_harness_build_epp_source_builds_once_into_the_cache_and_prints_only_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EPP_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    checkout = _checkout(tmp_path / "src")
    before = sorted(p.relative_to(checkout) for p in checkout.rglob("*"))

    assert go_binaries.main(["--epp-source", str(checkout)]) == 0
    captured = capsys.readouterr()
    path = Path(captured.out.strip())
    assert captured.out.count("\n") == 1  # stdout is the path alone: EPP=$(harness build --epp-source DIR)
    assert path == source_build.cached_path(source_build.revision_of(checkout))
    assert subprocess.run([str(path)], capture_output=True, text=True, check=True).stdout == "an EPP\n"
    assert gobuild.parse_build_info(path.read_bytes()).startswith(f"path\t{MODULE}/cmd/epp\n")
    assert "built in" in captured.err
    assert sorted(p.relative_to(checkout) for p in checkout.rglob("*")) == before  # nothing written there

    assert go_binaries.main(["--epp-source", str(checkout)]) == 0
    again = capsys.readouterr()
    assert Path(again.out.strip()) == path
    assert "cached" in again.err


def test_a_failed_source_build_is_one_error_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EPP_HARNESS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "go.mod").write_text(GO_MOD)
    assert go_binaries.main(["--epp-source", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error:" in captured.err
    assert "cmd/epp" in captured.err


@pytest.mark.parametrize(
    ("version", "package", "profile"),
    [
        pytest.param("v0.3.0", "cmd/epp", flag_profiles.V0_3, id="v0.3.0-full"),
        pytest.param("v1.5.0", "cmd/epp", flag_profiles.V1, id="v1.5.0-full"),
        pytest.param("1.6.0", "cmd/lwepp", flag_profiles.LWEPP, id="v1.6.0-lightweight"),
    ],
)
def test_the_upstream_epp_of_a_release_is_its_full_or_its_lightweight_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, package: str, profile: object
) -> None:
    build = go_binaries.upstream_epp_build(version)
    assert build.binaries[0].package == f"{go_binaries.UPSTREAM_EPP_MODULE}/{package}"
    binary = tmp_path / "upstream-epp"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setattr(go_binaries, "find_upstream_epp", lambda _version: binary)
    command = EppCommand.upstream(version)
    assert command.flags is profile
    # Only v0.3.0 binds controller-runtime's :8080 whatever its flags say (v1.x: its three ports).
    assert command.fixed_ports == ((8080,) if profile is flag_profiles.V0_3 else ())
    assert command.lacks == profile.lacks  # type: ignore[attr-defined]
