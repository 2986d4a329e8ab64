"""The container tier is opt-in (``harness.plugin.container_fixtures``), and its images are named by
their content (``harness.cluster.container_images``, ``harness.nodeagent.image_builds``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from harness.base.binaries import CACHE_ENV
from harness.cluster import container_engine, container_images
from harness.cluster.container_images import images_dir, tarball
from harness.nodeagent import containerfile
from harness.nodeagent.image_builds import EPP_IMAGE_REPOSITORY, EppImageBuild
from harness.plugin.container_fixtures import CONTAINERS_ENV

ROOT = Path(__file__).resolve().parents[3]

INNER_TESTS = """
import pytest

@pytest.mark.containers
def test_needs_an_engine():
    raise AssertionError("ran without --containers")

def test_plain():
    pass
"""


def test_container_tests_skip_unless_asked_for(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONTAINERS_ENV, raising=False)
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [f"*the container tier is opt-in: pass --containers or set {CONTAINERS_ENV}=1*"]
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A copy of what the EPP image is built from: the Containerfile and its COPY sources."""
    copy = tmp_path / "src"
    copy.mkdir()
    shutil.copy2(ROOT / containerfile.CONTAINERFILE, copy / containerfile.CONTAINERFILE)
    for stage in containerfile.read(ROOT / containerfile.CONTAINERFILE):
        for name, _ in containerfile.copy_sources(stage):
            origin, target = ROOT / name, copy / name
            if origin.is_dir():
                shutil.copytree(
                    origin, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
                )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)
    return copy


def test_the_epp_image_tag_follows_the_build_inputs_and_nothing_else(source: Path) -> None:
    tag = EppImageBuild(source).epp_tag()
    assert tag.startswith(f"{EPP_IMAGE_REPOSITORY}:")
    assert EppImageBuild(source).epp_tag() == tag, "the tag is not deterministic"

    (source / "epp" / "__pycache__").mkdir(exist_ok=True)
    (source / "epp" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"bytecode")
    (source / "tests").mkdir()  # not in any COPY line
    (source / "tests" / "test_x.py").write_text("pass\n")
    assert EppImageBuild(source).epp_tag() == tag, "files the build does not copy changed the tag"

    edited = source / "epp" / "__init__.py"
    edited.write_text(edited.read_text() + "\n# an edit\n")
    after_edit = EppImageBuild(source).epp_tag()
    assert after_edit != tag, "an edit to epp/ kept the cached image"

    lock = source / "requirements" / "epp.txt"
    lock.write_text(lock.read_text() + "\n# relocked\n")
    assert EppImageBuild(source).epp_tag() not in (tag, after_edit), "a new lock kept the cached image"


def test_the_containerfile_bases_are_build_arguments_defaulting_to_python_slim() -> None:
    text = (ROOT / containerfile.CONTAINERFILE).read_text()
    stages = containerfile.parse(text)
    assert [s.base for s in stages] == ["python:3.11-slim-bookworm"] * 2
    other = text.replace("ARG BASE_IMAGE=python:3.11-slim-bookworm", "ARG BASE_IMAGE=local/debian:1")
    assert [s.base for s in containerfile.parse(other)] == ["local/debian:1"] * 2
    assert containerfile.copy_sources(stages[0]) == [
        ("requirements/epp.txt", "requirements/epp.txt"),
        ("pyproject.toml", "./"),
        ("README.md", "./"),
        ("epp/", "epp/"),
    ]


def test_the_image_cache_keeps_the_newest_tarballs_of_each_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    images_dir().mkdir(parents=True)
    for age, version in enumerate(["e", "d", "c", "b", "a"]):  # "a" newest
        for repository in ("epp-harness/debian-python", "epp-harness/debian-python-wheels"):
            path = tarball(f"{repository}:{version}")
            path.write_bytes(b"")
            os.utime(path, (1_000_000 + age, 1_000_000 + age))
    container_images._prune("epp-harness/debian-python:a")
    left = sorted(p.name for p in images_dir().iterdir())
    assert left == [
        "epp-harness_debian-python+a.tar",
        "epp-harness_debian-python+b.tar",
        "epp-harness_debian-python+c.tar",
        *(f"epp-harness_debian-python-wheels+{v}.tar" for v in "abcde"),  # another repository: untouched
    ]


ENGINE_TESTS = """
def test_uses_the_engine(container_engine):
    raise AssertionError("an engine started")
"""


def test_without_an_engine_the_tier_skips_saying_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dockerd missing and nothing to install it with (no apt-get): a skip with that reason."""
    monkeypatch.setattr(container_engine, "ENGINE_PACKAGES", {Path("/nonexistent/dockerd"): "docker.io"})
    monkeypatch.setattr(container_engine.shutil, "which", lambda name: None)
    pytester.makepyfile(test_inner=ENGINE_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-rs", "--containers")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no container engine: docker.io missing and no apt-get to install them*"])
