"""Executables that answer ``--help`` as each EPP dialect's binary does, for the flag-profile tests."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from harness.cluster.releases import V1

# What each prints for --help (abridged from the real binaries; Go's flag package uses one dash).
V0_3_HELP: Final = """Usage of epp:
  -certPath string
  -grpcHealthPort int
  -grpcPort int
  -kubeconfig string
  -kvCacheUsagePercentageMetric string
  -metricsPort int
  -poolName string
  -poolNamespace string
  -v value
"""
V1_HELP: Final = f"""Usage of epp:
      --cert-path string
      --config-file string
      --grpc-health-port int     (default 9003)
      --grpc-port int            (default 9002)
      --metrics-port int         (default 9090)
      --pool-group string        (default "{V1.pool_group}")
      --pool-name string
      --pool-namespace string
  -v, --v Level
"""
LWEPP_HELP: Final = f"""Usage of lwepp:
      --grpc-health-port int     (default 9003)
      --grpc-port int            (default 9002)
      --kubeconfig string
      --metrics-port int         (default 9090)
      --pool-group string        (default "{V1.pool_group}")
      --pool-name string
      --pool-namespace string
      --zap-log-level level
"""


def fake_epp(directory: Path, help_text: str, name: str = "epp") -> Path:
    """An executable printing ``help_text`` on stderr for ``--help`` (as Go programs do) and exit 2."""
    path = directory / name
    path.write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{help_text}EOF\nexit 2\n")
    path.chmod(0o755)
    return path
