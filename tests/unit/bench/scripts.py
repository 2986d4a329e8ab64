"""The benchmark scripts under `benchmarks/`, loaded as modules by their file name (they are scripts,
not a package: each imports its siblings from its own directory)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def load(name: str) -> ModuleType:
    """`benchmarks/<name>.py` as a fresh module named `bench_<name>`."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
