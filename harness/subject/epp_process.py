"""The EPP as its own process, started the way a Deployment runs it: `python -m epp` with flags.

The e2e tests and the demo use this (the integration suite runs the EPP in-process instead). TLS stays
on, as in production, and is verifiable: the process serves a certificate (`--certPath`) issued by a
CA of its own for `server_name` (a Service DNS name, as cert-manager would issue in a cluster), and
`ext_proc_tls` tells Envoy what to trust. The certificate lives in a temp dir removed by `close()`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from harness.base.eventually import eventually
from harness.base.ports import LOOPBACK
from harness.base.process import ChildProcesses, ManagedProcess
from harness.cluster.certs import ExtProcTls, TinyCA
from harness.cluster.releases import session_generation
from harness.subject import epp_probe


def epp_server_name(pool_name: str, pool_namespace: str) -> str:
    """The name on an EPP's certificate: its Service's DNS name in a cluster."""
    return f"{pool_name}-epp.{pool_namespace}.svc"


def serving_certificate(server_name: str, cert_dir: Path) -> bytes:
    """Write ``tls.crt``/``tls.key`` for ``server_name`` (what ``--certPath`` reads, ours and
    upstream's alike) into ``cert_dir`` from a fresh CA; return that CA's PEM for Envoy."""
    # Common names are capped at 64 characters; the (longer) Service name goes in the SAN.
    ca = TinyCA(common_name="epp-serving-ca")
    pair = ca.issue_serving(dns_names=[server_name], ips=[], common_name="endpoint-picker")
    (cert_dir / "tls.crt").write_bytes(pair.cert_pem)
    key = cert_dir / "tls.key"
    key.touch(mode=0o600)
    key.write_bytes(pair.key_pem)
    return ca.cert_pem


class EppProcessIdentity:
    """What the harness reads of any EPP process it runs (ours or a foreign one): the name on its
    certificate, the trust Envoy needs for it, and whether it runs. A ``with`` block ends in
    ``close()``, not ``stop()``: ``stop()`` keeps the ports and certificate for a restart."""

    pool_name: str
    pool_namespace: str
    _process: ManagedProcess | None
    _ca_pem: bytes

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def server_name(self) -> str:
        """The name on the EPP's certificate: its Service's DNS name in a cluster."""
        return epp_server_name(self.pool_name, self.pool_namespace)

    @property
    def ext_proc_tls(self) -> ExtProcTls:
        """What Envoy trusts to verify this EPP (available once started)."""
        if not self._ca_pem:
            raise RuntimeError("the EPP has no certificate before start()")
        return ExtProcTls(ca_pem=self._ca_pem, server_name=self.server_name)

    @property
    def running(self) -> bool:
        """Started and still alive (a crash shows here, not only a `stop()`)."""
        return self._process is not None and self._process.running

    @property
    def pid(self) -> int | None:
        """The EPP's process id while it runs (for /proc readings in benchmarks)."""
        return self._process.pid if self._process is not None else None

    def pause(self) -> None:
        """SIGSTOP (the routing benchmark parks idle EPPs so their scrapes cost the others nothing)."""
        if self._process is not None:
            self._process.pause()

    def resume(self) -> None:
        if self._process is not None:
            self._process.resume()


@dataclass
class EppProcess(EppProcessIdentity):
    pool_name: str
    pool_namespace: str
    kubeconfig: Path
    extra_args: list[str] = field(default_factory=list)
    # --pool-group: the generation of the CRDs the harness installs (the session's); it also picks
    # the EPP's metric names (v0.3.0's inference_model_* for v1alpha2, inference_objective_* for v1).
    pool_group: str = field(default_factory=lambda: session_generation().pool_group)
    # Added to the inherited environment: the scheduler's thresholds are env vars, as upstream.
    extra_env: Mapping[str, str] = field(default_factory=dict)
    verbosity: int = 2
    # What outlives a restart (the ports, the certificate), released by close().
    _kept: ChildProcesses = field(default_factory=ChildProcesses, init=False)
    _ports: dict[str, int] = field(default_factory=dict, init=False)
    _process: ManagedProcess | None = field(default=None, init=False)
    _cert_dir: Path | None = field(default=None, init=False)
    _ca_pem: bytes = field(default=b"", init=False)

    def start(self, timeout: float = 30.0) -> None:
        """Spawn and wait until the process serves /metrics (ready to answer, pool or not)."""
        if not self._ports:
            self._ports = {name: self._kept.reserve_port() for name in ("grpc", "health", "metrics", "debug")}
        cert_dir = self._serving_certificate()
        args = [
            "-m",
            "epp",
            f"--poolName={self.pool_name}",
            f"--poolNamespace={self.pool_namespace}",
            f"--pool-group={self.pool_group}",
            f"--kubeconfig={self.kubeconfig}",
            f"--bindAddress={LOOPBACK}",
            f"--grpcPort={self.grpc_port}",
            f"--grpcHealthPort={self.health_port}",
            f"--metricsPort={self.metrics_port}",
            f"--debugPort={self.debug_port}",
            f"-v={self.verbosity}",
            f"--certPath={cert_dir}",
            # No load balancer health-checks a harness EPP unless a test sets one up (and then passes
            # its own delay): stopping need not wait for one to notice the drain.
            "--shutdownDelay=0s",
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
            self._process.kill()
            self._process = None

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self._kept.close()
            self._ports.clear()
            self._cert_dir = None

    def replica(self) -> EppProcess:
        """Another EPP process (not started) for the same pool, with the same flags, environment and
        serving certificate: a second pod of one Deployment, behind one Service name. Close it
        before this one, which owns the certificate."""
        other = EppProcess(
            self.pool_name,
            self.pool_namespace,
            self.kubeconfig,
            extra_args=list(self.extra_args),
            extra_env=dict(self.extra_env),
            verbosity=self.verbosity,
        )
        other._cert_dir, other._ca_pem = self._serving_certificate(), self._ca_pem
        return other

    def _serving_certificate(self) -> Path:
        """`tls.crt`/`tls.key` for `server_name` from this EPP's own CA; made once, kept across restarts."""
        if self._cert_dir is None:
            cert_dir = self._kept.temp_dir("epp-certs")
            self._cert_dir, self._ca_pem = cert_dir, serving_certificate(self.server_name, cert_dir)
        return self._cert_dir

    @property
    def grpc_port(self) -> int:
        return self._ports["grpc"]

    @property
    def health_port(self) -> int:
        return self._ports["health"]

    @property
    def metrics_port(self) -> int:
        return self._ports["metrics"]

    @property
    def debug_port(self) -> int:
        return self._ports["debug"]

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
