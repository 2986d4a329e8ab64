"""`benchmarks/mutation.py --integration`'s stage: each unit-tier survivor planted and run against its
package's integration subset once, its verdict kept until the mutant's diff changes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.unit.bench.scripts import BENCHMARKS, load

stage = load("mutation_integration")
ROOT = BENCHMARKS.parent


class Rig:
    """Fakes for the stage's three ways out: the diffs, the planting and the test run."""

    def __init__(
        self, diffs: dict[str, str], failing: set[str], missing: frozenset[str] = frozenset()
    ) -> None:
        self.diffs = diffs
        self.failing = failing  # the mutants the subset catches
        self.missing = missing  # the mutants whose lines are no longer in the source
        self.planted_now: str | None = None
        self.runs: list[tuple[str, tuple[str, ...], str]] = []

    @contextlib.contextmanager
    def planted(self, name: str) -> Iterator[bool]:
        if name in self.missing:
            yield False
            return
        self.planted_now = name
        try:
            yield True
        finally:
            self.planted_now = None

    def run_tests(self, tests: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
        assert self.planted_now is not None, "tests ran with no mutant planted"
        self.runs.append((self.planted_now, tuple(tests), env["HARNESS_KUBECONFIG"]))
        caught = self.planted_now in self.failing
        return (1, f"FAILED {tests[0]}::test_x - caught") if caught else (0, "")

    def check(self, package: str, verdicts: object, names: Sequence[str]) -> int:
        return int(
            stage.check(
                package,
                names,
                verdicts,
                diff_of=self.diffs.__getitem__,
                planted=self.planted,
                run_tests=self.run_tests,
                env={"HARNESS_KUBECONFIG": "/plane/kubeconfig"},
            )
        )


def test_each_survivor_runs_its_package_s_subset_with_the_shared_plane_and_is_judged(tmp_path: Path) -> None:
    rig = Rig({"a": "diff a", "b": "diff b"}, failing={"a"})
    verdicts = stage.Verdicts(tmp_path / "verdicts.json")
    assert rig.check("h2", verdicts, ["a", "b"]) == 2
    assert rig.runs == [
        ("a", stage.SUBSET_BY_PACKAGE["h2"], "/plane/kubeconfig"),
        ("b", stage.SUBSET_BY_PACKAGE["h2"], "/plane/kubeconfig"),
    ]
    assert verdicts.get("a", "diff a") == stage.KILLED
    assert verdicts.get("b", "diff b") == stage.SURVIVED


def test_a_judged_mutant_is_not_run_again_until_its_diff_changes(tmp_path: Path) -> None:
    path = tmp_path / "verdicts.json"
    rig = Rig({"a": "diff a"}, failing=set())
    rig.check("k8s", stage.Verdicts(path), ["a"])
    again = Rig({"a": "diff a"}, failing={"a"})
    assert again.check("k8s", stage.Verdicts(path), ["a"]) == 0  # read back from the file
    assert again.runs == []
    changed = Rig({"a": "diff a, since changed"}, failing={"a"})
    assert changed.check("k8s", stage.Verdicts(path), ["a"]) == 1
    assert stage.Verdicts(path).get("a", "diff a, since changed") == stage.KILLED
    assert stage.Verdicts(path).get("a", "diff a") is None


def test_a_mutant_whose_lines_are_gone_is_neither_run_nor_judged(tmp_path: Path) -> None:
    rig = Rig({"a": "diff a"}, failing={"a"}, missing=frozenset({"a"}))
    verdicts = stage.Verdicts(tmp_path / "verdicts.json")
    assert rig.check("datastore", verdicts, ["a"]) == 0
    assert rig.runs == []
    assert verdicts.get("a", "diff a") is None


@pytest.mark.parametrize("package", sorted(stage.SUBSET_BY_PACKAGE))
def test_every_package_s_subset_names_integration_tests_that_exist(package: str) -> None:
    for test in stage.SUBSET_BY_PACKAGE[package]:
        path, _, name = test.partition("::")
        assert path.startswith("tests/integration/"), test
        assert (ROOT / path).is_file(), test
        assert not name or f"def {name}(" in (ROOT / path).read_text(), test


def test_the_subsets_cover_the_six_packages_mutation_py_runs() -> None:
    assert set(stage.SUBSET_BY_PACKAGE) == set(load("mutation").DEFAULT_PACKAGES)
