"""Run the real helm (built from Go modules, ``harness.cluster.go_binaries.HELM``) on the project's chart.

helm keeps a cache, a config and a data directory under ``$HOME`` (repositories, plugins, the
registry login); here they live in a directory the caller owns (``home``), so nothing outside the
run is read or left behind. Releases are stored by helm in Secrets of the release's namespace, as
on any cluster.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import yaml

from harness.base.shipped import shipped_path
from harness.cluster import go_binaries

CHART: Final = "deploy/chart"
"""The chart the harness ships (`harness.base.shipped`): the checkout's, or the installed wheel's copy."""


def chart_dir() -> Path:
    return shipped_path(CHART)


def lint_values() -> Path:
    return shipped_path(f"{CHART}/ci/lint-values.yaml")


_TIMEOUT_S: Final = 180.0


class HelmError(RuntimeError):
    """helm exited non-zero; the message carries the command and its output."""


class Helm:
    """helm with its own home directory, optionally talking to the cluster of ``kubeconfig``."""

    def __init__(self, home: Path, kubeconfig: Path | None = None, binary: Path | None = None) -> None:
        self.home = home
        self.kubeconfig = kubeconfig
        self._binary = binary

    @property
    def binary(self) -> Path:
        if self._binary is None:
            self._binary = go_binaries.helm_path()
        return self._binary

    def run(self, *args: str, stdin: str | None = None, timeout: float = _TIMEOUT_S) -> str:
        """helm's stdout; raises HelmError with stdout and stderr when it fails."""
        env = {
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
            "PATH": "/usr/bin:/bin",
        }
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        command = [str(self.binary), *args]
        run = subprocess.run(
            command, input=stdin, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
        if run.returncode != 0:
            output = f"{run.stdout.strip()}\n{run.stderr.strip()}".strip()
            raise HelmError(f"helm {' '.join(args)} failed ({run.returncode}):\n{output}")
        return run.stdout

    def lint(self, chart: Path | None = None, values: Sequence[Path] | None = None) -> str:
        values = (lint_values(),) if values is None else values
        return self.run("lint", "--strict", str(chart or chart_dir()), *_values(values))

    def template(
        self,
        release: str,
        namespace: str,
        chart: Path | None = None,
        values: Sequence[Path] = (),
        set_values: Mapping[str, str] = {},
    ) -> str:
        return self._release("template", release, namespace, chart, values, set_values)

    def install(
        self,
        release: str,
        namespace: str,
        chart: Path | None = None,
        values: Sequence[Path] = (),
        set_values: Mapping[str, str] = {},
    ) -> str:
        """``helm install`` (no ``--wait``: readiness is what the caller checks, each its own way)."""
        return self._release("install", release, namespace, chart, values, set_values)

    def _release(
        self,
        verb: str,
        release: str,
        namespace: str,
        chart: Path | None,
        values: Sequence[Path],
        set_values: Mapping[str, str],
    ) -> str:
        """``helm <verb> <release> <chart>`` in ``namespace``: the chart the harness ships by default."""
        where = [str(chart or chart_dir()), "--namespace", namespace]
        return self.run(verb, release, *where, *_values(values), *_sets(set_values))

    def uninstall(self, release: str, namespace: str) -> str:
        return self.run("uninstall", release, "--namespace", namespace)


def rendered_kinds(manifest: str) -> list[str]:
    """``Kind/name`` of every object in a multi-document manifest, in order."""
    return [
        f"{doc['kind']}/{doc['metadata']['name']}"
        for doc in yaml.safe_load_all(manifest)
        if isinstance(doc, dict) and doc.get("kind")
    ]


def _values(paths: Sequence[Path]) -> list[str]:
    return [arg for path in paths for arg in ("--values", str(path))]


def _sets(values: Mapping[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
