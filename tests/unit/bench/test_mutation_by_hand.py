"""`benchmarks/mutation.py --by-hand`: a mutmut diff (one function, dedented, with its own line
numbers) swapped into the real source by its lines, at their indentation; `--survivors`: only the
survivors, by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.bench.scripts import load

mutation = load("mutation")

SOURCE = """class Subset:
    def describe(self) -> str:
        text = ",".join(items[:8])
        return text + (",..." if len(items) > 8 else "") if text else "(empty)"
"""
# As `mutmut show` prints it: the method alone, dedented, numbered from its own start.
DIFF = """# epp.handlers.subset.xǁSubsetǁdescribe__mutmut_19: survived
--- epp/handlers/subset.py
+++ epp/handlers/subset.py
@@ -1,3 +1,3 @@
 def describe(self) -> str:
     text = ",".join(items[:8])
-    return text + (",..." if len(items) > 8 else "") if text else "(empty)"
+    return text + (",..." if len(items) >= 8 else "") if text else "(empty)"
"""


def test_a_dedented_diff_lands_at_the_indentation_of_the_lines_it_replaces() -> None:
    removed, added, path = mutation.changed_lines(DIFF)
    assert path == "epp/handlers/subset.py"
    mutated = mutation.apply_mutant(SOURCE, removed, added)
    assert mutated == SOURCE.replace("> 8 else", ">= 8 else")


@pytest.mark.parametrize(
    ("removed", "added"),
    [
        pytest.param(["return 1"], ["return 2"], id="lines-not-there"),
        pytest.param([], ["x = 1"], id="nothing-removed"),
    ],
)
def test_a_mutant_whose_lines_are_not_there_is_not_applied(removed: list[str], added: list[str]) -> None:
    assert mutation.apply_mutant(SOURCE, removed, added) is None


def test_survivors_are_run_again_by_name_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--survivors`: mutmut gets exactly the survivors' names (it re-runs named mutants whatever
    they got before), never the package's glob, which would leave the survivors as they were."""
    found = {
        "epp.k8s.a__mutmut_1": "killed",
        "epp.k8s.a__mutmut_2": "survived",
        "epp.k8s.b__mutmut_1": "timeout",
        "epp.k8s.b__mutmut_2": "no tests",
        "epp.k8s.c__mutmut_1": "not checked",
    }
    runs: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setattr(mutation, "ensure_mutmut", lambda: None)
    monkeypatch.setattr(mutation, "verdicts", lambda package: found)
    monkeypatch.setattr(mutation, "report", lambda package, verdicts, seconds: None)
    monkeypatch.setattr(
        mutation, "run", lambda package, children, names=(): runs.append((package, tuple(names))) or 1.0
    )
    assert mutation.main(["k8s", "--survivors"]) == 0
    assert runs == [("k8s", ("epp.k8s.a__mutmut_2", "epp.k8s.b__mutmut_2"))]
    runs.clear()
    assert mutation.main(["k8s"]) == 0
    assert runs == [("k8s", ())]


TWO_FUNCTIONS = """class Connection:
    def _fast(self) -> None:
        if inflow.available < inflow.size >> 1:
            pass

    def _messages(self) -> None:
        if inflow.available < inflow.size >> 1:
            pass
"""


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(
            "epp.h2.connection.xǁConnectionǁ_messages__mutmut_76", ("Connection", "_messages"), id="method"
        ),
        pytest.param(
            "epp.h2.frames.x_literal_indexed_name__mutmut_3", (None, "literal_indexed_name"), id="function"
        ),
    ],
)
def test_a_mutant_s_name_gives_its_class_and_function(name: str, expected: tuple[str | None, str]) -> None:
    assert mutation.mutated_function(name) == expected


def test_lines_found_in_two_functions_are_changed_in_the_mutated_one() -> None:
    start = mutation.function_start(TWO_FUNCTIONS, "Connection", "_messages")
    removed = ["if inflow.available < inflow.size >> 1:"]
    added = ["if inflow.available < inflow.size << 1:"]
    mutated = mutation.apply_mutant(TWO_FUNCTIONS, removed, added, start)
    assert mutated is not None
    fast, messages = mutated.split("def _messages")
    assert "<< 1" not in fast
    assert "<< 1" in messages


@pytest.mark.parametrize(
    ("content", "code"),
    [pytest.param(None, 4, id="a-path-that-does-not-exist"), pytest.param("", 5, id="no-tests-collected")],
)
def test_tests_that_could_not_run_stop_the_check_and_never_count_as_a_kill(
    tmp_path: Path, content: str | None, code: int
) -> None:
    """Only pytest's 1 (some test failed) kills a mutant: a mistyped path used to read as KILLED."""
    path = tmp_path / "test_nothing.py"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit, match=f"did not run \\(exit code {code}\\)"):
        mutation.run_tests([str(path)])


ONE_LINE_TWICE = """class Informer:
    async def relist(self) -> None:
        try:
            await self.list()
        except ApiError as exc:
            await self.back_off(f"list failed: {exc}")
        except KubeError as exc:
            await self.back_off(f"list failed: {exc}")
"""
# mutmut's hunk counts from the function's own first line (the def is line 1).
SECOND_BRANCH = """# epp.k8s.informer.xǁInformerǁrelist__mutmut_15: survived
--- epp/k8s/informer.py
+++ epp/k8s/informer.py
@@ -5,3 +5,3 @@
         await self.back_off(f"list failed: {exc}")
     except KubeError as exc:
-        await self.back_off(f"list failed: {exc}")
+        await self.back_off(None)
"""


def test_a_line_found_twice_in_the_mutated_function_is_changed_where_the_hunk_says() -> None:
    """The same `back_off` line in two `except` branches: the mutant is planted in the second, the
    one mutmut changed (planting the first once read as a kill for tests of the other branch)."""
    removed, added, _ = mutation.changed_lines(SECOND_BRANCH)
    assert mutation.removed_offset(SECOND_BRANCH) == 6
    start = mutation.function_start(ONE_LINE_TWICE, "Informer", "relist")
    mutated = mutation.apply_mutant(
        ONE_LINE_TWICE, removed, added, start, mutation.removed_offset(SECOND_BRANCH)
    )
    assert mutated is not None
    api_error, kube_error = mutated.split("except KubeError")
    assert "back_off(None)" not in api_error
    assert "back_off(None)" in kube_error
