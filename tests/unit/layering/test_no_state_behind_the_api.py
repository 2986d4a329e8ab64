"""State reaches the EPP only through the API server (STYLE.md habit 19).

Integration and e2e tests, and the harness that drives them, must never import the datastore or call
one of its mutators. The list of mutators is derived from the Datastore Protocol, so a new write
method is covered the day it is added.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from epp.datastore import Datastore

ROOT = Path(__file__).resolve().parents[3]
GUARDED_TREES = ("tests/integration", "tests/e2e", "harness")
READ_PREFIXES = (
    "pod_get",
    "objective_get",
    "rewrite_get",
    "rewrite_match",
    "pool_get",
    "pool_has_synced",
    "pool_labels_match",
)
# Harness modules that host the EPP's own code without an API server, and may therefore write its
# datastore as the EPP's reconcilers and prober do. Each with the reason.
ALLOWED = {
    "harness/cli/bench/virtual/epp_host.py": (
        "the virtual-time benchmark runs the EPP's datastore, accounting and scheduler in a "
        "discrete-event loop; no API server takes part, so the pool, pods and scrapes are written "
        "as the reconcilers and the prober would"
    ),
}
# Too generic to flag on any receiver (dict.clear(), list.clear()): only when the receiver is a store.
GENERIC_NAMES = frozenset({"clear"})


def datastore_mutators() -> frozenset[str]:
    names = {
        name
        for name, _ in inspect.getmembers(Datastore, predicate=inspect.isfunction)
        if not name.startswith("_")
    }
    return frozenset(n for n in names if not n.startswith(READ_PREFIXES))


def violations(source: str, mutators: frozenset[str]) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if _is_datastore(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and _is_datastore(node.module):
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name in mutators and (
                name not in GENERIC_NAMES or "store" in ast.unparse(node.func.value).lower()
            ):
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}()")
    return found


def _is_datastore(module: str) -> bool:
    return module == "epp.datastore" or module.startswith("epp.datastore.")


def guarded_files() -> list[Path]:
    return sorted(p for tree in GUARDED_TREES for p in (ROOT / tree).rglob("*.py"))


def test_mutator_list_is_derived_from_the_protocol() -> None:
    mutators = datastore_mutators()
    assert {
        "pool_set",
        "pod_update_or_add",
        "pod_delete",
        "rewrite_set",
        "objective_set",
        "clear",
    } <= mutators
    assert not any(m.startswith(READ_PREFIXES) for m in mutators)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("from epp.datastore import new_datastore\n", 1, id="from-import"),
        pytest.param("import epp.datastore._store as s\n", 1, id="plain-import"),
        pytest.param("epp.datastore.pod_delete(k)\n", 1, id="mutator-call"),
        pytest.param("self.datastore.clear()\n", 1, id="clear-on-a-store"),
        pytest.param("seen.clear()\n", 0, id="clear-on-a-dict-is-fine"),
        pytest.param("view = client.get('/debug/datastore')\n", 0, id="debug-view-read-is-fine"),
    ],
)
def test_checker_flags_what_it_should(source: str, expected: int) -> None:
    assert len(violations(source, datastore_mutators())) == expected


def test_integration_e2e_and_harness_never_write_the_datastore() -> None:
    mutators = datastore_mutators()
    files = guarded_files()
    assert files, "nothing to check: the guarded trees are empty"
    problems = {
        name: v
        for p in files
        if (name := str(p.relative_to(ROOT))) not in ALLOWED and (v := violations(p.read_text(), mutators))
    }
    assert not problems, f"state injected behind the API server's back: {problems}"


def test_every_allowed_module_exists_and_needs_its_exemption() -> None:
    mutators = datastore_mutators()
    for name in ALLOWED:
        assert violations((ROOT / name).read_text(), mutators), f"{name} no longer needs its exemption"
