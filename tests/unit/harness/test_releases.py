"""harness.cluster.releases: which API generation each CRD release speaks, and what v1.6.0 borrows."""

from __future__ import annotations

import pytest

from harness.cluster import releases


@pytest.mark.parametrize(
    ("release", "generation"),
    [
        pytest.param("v0.3.0", releases.V1ALPHA2, id="v0.3.0-alpha"),
        *(pytest.param(r, releases.V1, id=f"{r}-ga") for r in releases.RELEASES[1:]),
    ],
)
def test_each_release_maps_to_its_generation(release: str, generation: releases.Generation) -> None:
    assert releases.generation_of(release) is generation


def test_the_generations_name_their_pool_api() -> None:
    assert releases.V1.pool_api_version == "inference.networking.k8s.io/v1"
    assert releases.V1ALPHA2.pool_api_version == "inference.networking.x-k8s.io/v1alpha2"


@pytest.mark.parametrize(("release", "borrowed"), [("v1.6.0", "v1.5.0"), ("v1.5.0", None), ("v0.3.0", None)])
def test_only_a_release_without_the_optional_kinds_borrows_them(release: str, borrowed: str | None) -> None:
    assert releases.supplement_release(release) == borrowed
    note = releases.supplement_note(release)
    assert (note is None) == (borrowed is None)
    if borrowed:
        assert note is not None
        assert f"installing them from {borrowed}" in note


@pytest.mark.parametrize("release", ["v0.2.0", "v1.7.0", "1.5.0", ""])
def test_an_unknown_release_is_refused_with_the_list(release: str) -> None:
    with pytest.raises(releases.UnknownReleaseError, match=r"v0\.3\.0, v1\.0\.0"):
        releases.generation_of(release)


def test_the_environment_chooses_the_default_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(releases.CRD_RELEASE_ENV, "v1.5.0")
    assert releases.default_release() == "v1.5.0"
    monkeypatch.setenv(releases.CRD_RELEASE_ENV, "v9")
    with pytest.raises(releases.UnknownReleaseError):
        releases.default_release()
    monkeypatch.delenv(releases.CRD_RELEASE_ENV)
    assert releases.default_release() == releases.DEFAULT_CRD_RELEASE
