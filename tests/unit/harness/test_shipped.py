"""harness.base.shipped: the chart, the examples and the Containerfile, found in a wheel or a checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.base.shipped import PACKAGED_DIR, ShippedFileMissingError, shipped_path

CHART_YAML = "deploy/chart/Chart.yaml"


def _package(root: Path) -> Path:
    harness = root / "site" / "harness"
    harness.mkdir(parents=True)
    return harness


def test_an_installed_copy_is_preferred(tmp_path: Path) -> None:
    harness = _package(tmp_path)
    packaged = harness / PACKAGED_DIR / CHART_YAML
    packaged.parent.mkdir(parents=True)
    packaged.write_text("name: inferencepool\n")
    (harness.parent / "deploy" / "chart").mkdir(parents=True)
    (harness.parent / CHART_YAML).write_text("name: other\n")

    assert shipped_path(CHART_YAML, harness) == packaged


def test_a_checkout_is_used_when_nothing_is_packaged(tmp_path: Path) -> None:
    harness = _package(tmp_path)
    (harness.parent / "Containerfile").write_text("FROM scratch\n")

    assert shipped_path("Containerfile", harness) == harness.parent / "Containerfile"


def test_a_missing_file_names_both_places(tmp_path: Path) -> None:
    harness = _package(tmp_path)
    with pytest.raises(ShippedFileMissingError, match="reinstall the wheel") as caught:
        shipped_path(CHART_YAML, harness)
    assert str(harness / PACKAGED_DIR) in str(caught.value)


@pytest.mark.parametrize("relative", ["tests/conftest.py", "deploy/chartx", "../Containerfile"])
def test_only_shipped_paths_are_looked_up(relative: str) -> None:
    with pytest.raises(ValueError, match="not under any shipped path"):
        shipped_path(relative)


def test_this_checkout_ships_every_file_it_declares() -> None:
    assert shipped_path(CHART_YAML).read_text().startswith("apiVersion")
    assert shipped_path("examples/cluster/vllm-sim.yaml").is_file()
    assert shipped_path("Containerfile").is_file()
