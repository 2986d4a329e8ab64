"""The EPP as its own process, started the way a Deployment runs it: `python -m epp` with flags.

The e2e tests and the demo use this (the integration suite runs the EPP in-process instead). TLS stays
on, as in production: Envoy's ext_proc cluster accepts the self-signed certificate.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import epp_probe
from harness.eventually import eventually
from harness.ports import LOOPBACK, PortReservation, reserve_port
from harness.process import ManagedProcess


@dataclass
class EppProcess:
    pool_name: str
    pool_namespace: str
    kubeconfig: Path
    extra_args: list[str] = field(default_factory=list)
    # Added to the inherited environment: the scheduler's thresholds are env vars, as upstream.
    extra_env: Mapping[str, str] = field(default_factory=dict)
    verbosity: int = 2
    _ports: dict[str, PortReservation] = field(default_factory=dict, init=False)
    _process: ManagedProcess | None = field(default=None, init=False)

    def start(self, timeout: float = 30.0) -> None:
        """Spawn and wait until the process serves /metrics (ready to answer, pool or not)."""
        if not self._ports:
            self._ports = {name: reserve_port() for name in ("grpc", "health", "metrics", "debug")}
        args = [
            "-m",
            "epp",
            f"--poolName={self.pool_name}",
            f"--poolNamespace={self.pool_namespace}",
            f"--kubeconfig={self.kubeconfig}",
            f"--bindAddress={LOOPBACK}",
            f"--grpcPort={self.grpc_port}",
            f"--grpcHealthPort={self.health_port}",
            f"--metricsPort={self.metrics_port}",
            f"--debugPort={self.debug_port}",
            f"-v={self.verbosity}",
            *self.extra_args,
        ]
        self._process = ManagedProcess(
            "epp",
            sys.executable,
            args,
            health_url=f"{self.metrics_url}/metrics",
            start_timeout=timeout,
            stop_timeout=10.0,
            env={**os.environ, **self.extra_env},
        )
        self._process.start()

    def stop(self) -> None:
        """SIGTERM (graceful) then SIGKILL; ports stay reserved for a restart until `close()`."""
        if self._process is not None:
            self._process.stop()
            self._process = None

    def kill(self) -> None:
        """Simulate a crash: SIGKILL, no graceful shutdown."""
        if self._process is not None:
            self._process.stop_timeout = 0.0
            self.stop()

    def close(self) -> None:
        self.stop()
        for reservation in self._ports.values():
            reservation.release()
        self._ports.clear()

    def __enter__(self) -> EppProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        """Started and still alive (a crash shows here, not only a `stop()`)."""
        return self._process is not None and self._process.running

    @property
    def pid(self) -> int | None:
        """The EPP's process id while it runs (for /proc readings in benchmarks)."""
        return self._process.pid if self._process is not None else None

    @property
    def grpc_port(self) -> int:
        return self._ports["grpc"].port

    @property
    def health_port(self) -> int:
        return self._ports["health"].port

    @property
    def metrics_port(self) -> int:
        return self._ports["metrics"].port

    @property
    def debug_port(self) -> int:
        return self._ports["debug"].port

    @property
    def ext_proc_address(self) -> str:
        return f"{LOOPBACK}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics_port}"

    @property
    def debug_url(self) -> str:
        """Base URL of /debug/datastore (its own listener, loopback: `--debugPort`)."""
        return f"http://{LOOPBACK}:{self.debug_port}"

    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines) if self._process is not None else ""

    def health(self, service: str = "") -> str:
        return epp_probe.health(f"{LOOPBACK}:{self.health_port}", service)

    def wait_serving(self, timeout: float = 30.0) -> None:
        def serving() -> None:
            assert self.health() == "SERVING", "EPP health is not SERVING (pool not synced yet?)"

        eventually(serving, timeout=timeout, message=f"EPP serving pool {self.pool_name}")

    def metrics_text(self) -> str:
        return epp_probe.metrics_text(self.metrics_url)

    def datastore_view(self) -> dict[str, Any]:
        return epp_probe.datastore_view(self.debug_url)
