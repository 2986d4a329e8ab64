"""Any EPP command line as a process the harness can put behind Envoy: ours, upstream's Go EPP, yours.

``EppProcess`` knows our EPP's extra doors (``/debug/datastore``, an unauthenticated ``/metrics``,
``--bindAddress``); an EPP under test has none of them. This module launches one knowing only what
upstream's own manifests rely on, so the same code runs our EPP, upstream v0.3.0 and anyone else's:

* **Flags**: the names of the EPP's flag dialect (``EppCommand.flags``,
  `harness.subject.flag_profiles`: v0.3's ``--poolName`` ..., v1's ``--pool-name`` ..., lwepp's
  reduced set), detected from its ``--help`` unless given: pool name and namespace (and group, when
  the Stack names one), kubeconfig (flag where the dialect has one, always ``$KUBECONFIG``), the
  three ports, the certificate directory, ``-v``.
  ``extra_args`` go to every EPP; ``ours_args`` (our Python-only flags: ``--bindAddress``,
  ``--debugPort``, ``--maxRequestBodyBytes`` ...) only when ``EppCommand.dialect == "ours"``. The
  ports are reserved by ``harness.base.ports``.
* **TLS Envoy can verify**: a certificate for ``<pool>-epp.<namespace>.svc`` from a fresh CA,
  handed over with ``--certPath`` (``tls.crt``/``tls.key``, upstream's layout);
  ``ForeignEpp.ext_proc_tls`` is what ``harness.dataplane.envoy.Envoy(ext_proc_tls=...)`` trusts. An EPP that
  ignores ``--certPath`` fails its start: the handshake below never verifies.
* **Readiness** is what Envoy needs, not what the EPP says: ``start()`` returns once the ext_proc
  port completes a verified TLS handshake (HTTP/2 ALPN); ``wait_serving()`` until gRPC health is
  also SERVING (pool known). Health alone is not enough: upstream v0.3.0 reports SERVING 0.3-4 s
  before its ext_proc port listens (it first generates an RSA-4096 key), and requests sent in that
  gap get 502s.
* **Fixed ports** (``EppCommand.fixed_ports``): ports a program binds on every address whatever its
  flags say. Upstream v0.3.0's controller-runtime manager always serves its own metrics on
  ``:8080`` (no flag moves it), so two such EPPs on one host collide. Each fixed port is claimed
  with the harness's port lock (``harness.base.ports.claim_port``) for the life of the process: a second
  instance waits up to ``fixed_port_wait`` seconds and then fails with a message saying why, instead
  of crashing on a bind error. Such EPPs run one at a time per host (or each in its own network
  namespace, which this module does not set up).

Usage (a running control plane ``plane`` and a pool ``my-pool`` in namespace ``ns``)::

    command = EppCommand.upstream()                      # the binary of `harness build --upstream-epp v0.3.0`
    command = EppCommand.parse("/path/to/epp --flag=x")  # any command line (upstream dialect)
    with ForeignEpp(command, "my-pool", "ns", plane.access.kubeconfig_path) as epp:
        epp.wait_serving()
        options = EnvoyOptions(request_body_mode=command.envoy_request_body_mode)
        with Envoy(epp.ext_proc_address, options=options, ext_proc_tls=epp.ext_proc_tls) as envoy:
            ...  # send requests to envoy.base_url

Upstream v0.3.0 reads the KV-cache gauge as ``vllm:gpu_cache_usage_perc`` by default; simulators of
vLLM >= 0.10 (the default) publish ``vllm:kv_cache_usage_perc``: its profile's ``metric_args`` say
so (``sim_metric_args``; v1.5.0 reads the new name by default).
Its ``/metrics`` wants a bearer token allowed by TokenReview/SubjectAccessReview, so nothing here
reads it.

Envoy's body mode follows the EPP (``EppCommand.envoy_options``, applied by the Stack): BUFFERED
for ours (it speaks both) and upstream v0.3.0's default server (its streaming one needs
``USE_STREAMING=true`` in its environment and ``request_body_mode="FULL_DUPLEX_STREAMED"``); a v1.x
EPP (flag profile v1) gets upstream's v1 mode, ``EnvoyOptions.v1``: it serves only
FULL_DUPLEX_STREAMED bodies and answers nothing before the body, so a BUFFERED Envoy, which waits
for the headers' answer before it sends the body, only times out. lwepp gets ``EnvoyOptions.lwepp``
(a buffered body streamed in one chunk, sent before the headers' answer): its plain CONTINUE to
each body chunk is refused by Envoy in full duplex.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import grpc

from harness.base.binaries import BinaryNotFoundError
from harness.base.eventually import eventually
from harness.base.ports import LOOPBACK, PortReservation, claim_port, reserve_port
from harness.base.process import ManagedProcess, temp_prefix
from harness.cluster import go_binaries, releases
from harness.cluster.certs import UNVERIFIED_EXT_PROC_TLS, ExtProcTls
from harness.dataplane.envoy import EnvoyOptions, RequestBodyMode
from harness.subject import epp_probe, flag_profiles
from harness.subject.epp_process import EppProcessIdentity, serving_certificate
from harness.subject.flag_profiles import FlagProfile

Dialect = Literal["upstream", "ours"]

CONTROLLER_RUNTIME_METRICS_PORT: Final = 8080
"""Where controller-runtime's manager serves metrics unless the program moves it (v0.3.0 does not)."""

DEFAULT_START_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class EppCommand:
    """What to run: the command line before the harness's flags, which flags it takes, fixed ports."""

    argv: tuple[str, ...]
    dialect: Dialect = "upstream"
    fixed_ports: tuple[int, ...] = ()
    label: str = ""
    # How its Envoy sends the request body (``EnvoyOptions.request_body_mode``); None: BUFFERED, the
    # harness's default (DESIGN.md §2), which every dialect speaks.
    request_body_mode: RequestBodyMode | None = None
    flags: FlagProfile = flag_profiles.V0_3  # which flag names it takes
    # The capabilities it lacks (`harness.verdicts.departures.CAPABILITIES`); None: its profile's.
    lacks_override: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("an EPP command needs at least the program to run")

    @property
    def lacks(self) -> frozenset[str]:
        """What scenarios it is not asked to pass: ``lacks_override`` if set, else its profile's."""
        return self.flags.lacks if self.lacks_override is None else self.lacks_override

    @property
    def envoy_request_body_mode(self) -> RequestBodyMode:
        """``request_body_mode`` if set, else FULL_DUPLEX_STREAMED for a v1.x EPP, else BUFFERED."""
        if self.request_body_mode is not None:
            return self.request_body_mode
        if self.speaks_v1_protocol:
            return (
                EnvoyOptions.lwepp().request_body_mode
                if self.flags.envoy_protocol == "lwepp"
                else "FULL_DUPLEX_STREAMED"
            )
        return "BUFFERED"

    @property
    def speaks_v1_protocol(self) -> bool:
        """A v1.x EPP of upstream's (not ours, which speaks both): its Envoy runs in v1 mode."""
        return self.dialect != "ours" and self.flags.envoy_protocol in ("v1", "lwepp")

    def envoy_options(self, base: EnvoyOptions) -> EnvoyOptions:
        """``base`` (a scenario's Envoy) as this EPP needs it: for a v1.x EPP the request side of
        upstream's v1 mode (`EnvoyOptions.v1`: the request body FULL_DUPLEX_STREAMED with trailers,
        the long message timeout), every other setting kept; else with ``envoy_request_body_mode``."""
        if (
            self.speaks_v1_protocol
            and self.request_body_mode is None
            and self.flags.envoy_protocol == "lwepp"
        ):
            lwepp = EnvoyOptions.lwepp()
            return dataclasses.replace(
                base,
                request_body_mode=lwepp.request_body_mode,
                body_before_header_response=lwepp.body_before_header_response,
                buffer_request_body=lwepp.buffer_request_body,
                message_timeout_s=lwepp.message_timeout_s,
            )
        if self.speaks_v1_protocol and self.request_body_mode is None:
            v1 = EnvoyOptions.v1()
            # The request side only: with the response side in full duplex too (all of
            # `EnvoyOptions.v1`), v1.5.0 served the first request of a connection and the next hung
            # until the client's read timeout (measured: every Stack start of the conformance run
            # timed out; with the request side alone those scenarios pass).
            return dataclasses.replace(
                base, request_body_mode=v1.request_body_mode, message_timeout_s=v1.message_timeout_s
            )
        if self.request_body_mode is not None:
            return dataclasses.replace(base, request_body_mode=self.request_body_mode)
        return base

    @property
    def name(self) -> str:
        """A short name for reports and process logs."""
        return self.label or Path(self.argv[0]).name

    @classmethod
    def parse(
        cls,
        command_line: str,
        *,
        dialect: Dialect = "upstream",
        fixed_ports: Sequence[int] = (),
        label: str = "",
    ) -> EppCommand:
        """A shell-style command line (``"/opt/epp -zap-devel=false"``), split with ``shlex``."""
        return cls(tuple(shlex.split(command_line)), dialect, tuple(fixed_ports), label)

    @classmethod
    def from_text(cls, text: str, fixed_ports: str | None = None, flags: str | None = None) -> EppCommand:
        """What a user types (``--epp-command``): ``ours``, ``upstream[:vX.Y.Z]``, or a command line.
        A command line of unknown provenance is assumed to bind controller-runtime's ``:8080`` as
        upstream's does (so two never run at once on a host) unless ``fixed_ports`` (a comma list,
        ``""`` for none) says otherwise; its flag dialect is ``flags`` (a profile name, checked
        against its ``--help``) or read off its ``--help``.

        Raises ``BinaryNotFoundError`` for an upstream release that is not built, and
        ``FlagProfileError`` naming the flag when the profile does not fit the command.
        """
        if text == "ours":
            return cls.ours()
        if text == "upstream" or text.startswith("upstream:"):
            _, _, version = text.partition(":")
            return cls.upstream(version) if version else cls.upstream()
        ports = (
            (CONTROLLER_RUNTIME_METRICS_PORT,)
            if fixed_ports is None
            else tuple(int(p) for p in fixed_ports.split(",") if p.strip())
        )
        command = cls.parse(text, fixed_ports=ports)
        return dataclasses.replace(command, flags=flag_profiles.resolve(command.argv, flags))

    @classmethod
    def ours(cls) -> EppCommand:
        """Our EPP, as ``EppProcess`` runs it (``python -m epp``): upstream v1's flag names, so it is
        told the pool group of the CRDs the harness installed."""
        return cls((sys.executable, "-m", "epp"), "ours", (), "epp (ours)", flags=flag_profiles.V1)

    @classmethod
    def upstream(cls, version: str = go_binaries.UPSTREAM_EPP_VERSION) -> EppCommand:
        """Upstream's Go EPP at ``version``, built by ``harness build --upstream-epp v<version>``.

        Raises ``BinaryNotFoundError`` saying that command when it is not built (it is never built
        implicitly: about 4 minutes and 1 GiB of Go modules).
        """
        path = go_binaries.find_upstream_epp(version)
        version = version.removeprefix("v")
        if path is None:
            raise BinaryNotFoundError(
                f"upstream EPP v{version} is not built: run `harness build --upstream-epp v{version}` "
                f"(or set $TEST_ASSET_UPSTREAM_EPP to a binary of that release)"
            )
        if version.startswith("0."):
            profile = flag_profiles.V0_3
        elif go_binaries.upstream_epp_package(version).endswith("/lwepp"):
            profile = flag_profiles.LWEPP
        else:
            profile = flag_profiles.V1
        # v0.3.0's manager binds :8080 whatever its flags say; v1.x moved its metrics to
        # --metrics-port and binds only the three ports it is given (measured: v1.5.0).
        fixed = (CONTROLLER_RUNTIME_METRICS_PORT,) if profile is flag_profiles.V0_3 else ()
        return cls((str(path),), "upstream", fixed, f"upstream EPP v{version}", flags=profile)


def sim_metric_args(command: EppCommand) -> list[str]:
    """Flags that point an upstream-dialect EPP at the simulators' metric names (ours finds either)."""
    if command.dialect == "ours":
        return []
    return list(command.flags.metric_args)


@dataclass
class ForeignEpp(EppProcessIdentity):
    """One EPP process from an ``EppCommand``; same lifecycle as ``EppProcess`` (start/stop/close)."""

    command: EppCommand
    pool_name: str
    pool_namespace: str
    kubeconfig: Path
    extra_args: Sequence[str] = ()
    ours_args: Sequence[str] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    verbosity: int = 2
    fixed_port_wait: float = 0.0
    # Passed where the dialect has the flag (v1, lwepp); None: the group of the default CRD release's
    # generation (what the harness installs unless told otherwise).
    pool_group: str | None = None
    _ports: dict[str, PortReservation] = field(default_factory=dict, init=False)
    _fixed: list[PortReservation] = field(default_factory=list, init=False)
    _process: ManagedProcess | None = field(default=None, init=False)
    _cert_dir: Path | None = field(default=None, init=False)
    _owns_cert_dir: bool = field(default=True, init=False)  # False in a replica: the first one's
    _ca_pem: bytes = field(default=b"", init=False)

    def argv(self) -> list[str]:
        """The full command line (ports must be reserved: after ``start()``)."""
        assert self._cert_dir is not None, "no certificate before start()"
        flags = self.command.flags
        args = [
            *self.command.argv,
            f"{flags.pool_name}={self.pool_name}",
            f"{flags.pool_namespace}={self.pool_namespace}",
            f"{flags.grpc_port}={self.grpc_port}",
            f"{flags.grpc_health_port}={self.health_port}",
            f"{flags.metrics_port}={self.metrics_port}",
        ]
        if flags.kubeconfig:  # else $KUBECONFIG only (see _start)
            args.append(f"{flags.kubeconfig}={self.kubeconfig}")
        if flags.cert_path:
            args.append(f"{flags.cert_path}={self._cert_dir}")
        if flags.verbosity:
            args.append(f"{flags.verbosity}={self.verbosity}")
        if flags.pool_group:
            group = self.pool_group or releases.generation_of(releases.default_release()).pool_group
            args.append(f"{flags.pool_group}={group}")
        if self.command.dialect == "ours":
            args += [f"--bindAddress={LOOPBACK}", f"--debugPort={self._ports['debug'].port}", *self.ours_args]
        return [*args, *self.extra_args]

    def start(self, timeout: float = DEFAULT_START_TIMEOUT_S) -> None:
        """Spawn and wait until the ext_proc port serves verified TLS; on failure undo everything."""
        if self._process is not None:
            raise RuntimeError(f"{self.command.name} already started")
        try:
            self._start(timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, timeout: float) -> None:
        if not self._ports:
            names = ("grpc", "health", "metrics", *(("debug",) if self.command.dialect == "ours" else ()))
            self._ports = {name: reserve_port() for name in names}
        if not self._fixed:
            self._fixed = [self._claim(port) for port in self.command.fixed_ports]
        if self._cert_dir is None:
            self._cert_dir = Path(tempfile.mkdtemp(prefix=temp_prefix("epp-certs")))
            self._ca_pem = serving_certificate(self.server_name, self._cert_dir)
        argv = self.argv()
        self._process = ManagedProcess(
            "epp",
            argv[0],
            argv[1:],
            health_check=self._tls_ready,
            start_timeout=timeout,
            stop_timeout=10.0,
            # Every dialect finds the cluster through $KUBECONFIG too (controller-runtime's order);
            # for v1.x's full EPP, which has no --kubeconfig flag, it is the only way.
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.extra_env},
        )
        self._process.start()

    def _claim(self, port: int) -> PortReservation:
        try:
            return claim_port(port, wait=self.fixed_port_wait)
        except Exception as exc:
            raise RuntimeError(
                f"{self.command.name} always binds port {port} (whatever its flags say), and that port is "
                f"taken: {exc}. Run such EPPs one at a time on a host (pytest -n 1), or each in its own "
                "network namespace"
            ) from exc

    def _tls_ready(self) -> bool:
        if self.command.flags.cert_path is None:  # its own self-signed certificate: TLS, unverified
            epp_probe.tls_handshake(self.ext_proc_address, b"", "")
        else:
            epp_probe.tls_handshake(self.ext_proc_address, self._ca_pem, self.server_name)
        return True

    @property
    def ext_proc_tls(self) -> ExtProcTls:
        """What Envoy trusts: our CA, or nothing for an EPP that takes no certificate (lwepp)."""
        if self.command.flags.cert_path is None:
            return UNVERIFIED_EXT_PROC_TLS
        return super().ext_proc_tls

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Until gRPC health is SERVING (the pool is known) and ext_proc completes a TLS handshake."""

        def serving() -> None:
            assert self.running, f"{self.command.name} exited:\n{self.log_tail()}"
            try:
                status = self.health()
                self._tls_ready()
            except (OSError, grpc.RpcError) as exc:
                raise AssertionError(f"not reachable yet: {exc}") from exc
            assert status == "SERVING", f"gRPC health is {status} (pool not known yet?)"

        eventually(
            serving,
            timeout=timeout,
            message=f"{self.command.name} serving pool {self.pool_namespace}/{self.pool_name}",
        )

    def stop(self) -> None:
        """SIGTERM then SIGKILL; ports and the certificate stay for a restart until ``close()``."""
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
        for reservation in [*self._ports.values(), *self._fixed]:
            reservation.release()
        self._ports.clear()
        self._fixed.clear()
        if self._cert_dir is not None:
            if self._owns_cert_dir:
                shutil.rmtree(self._cert_dir, ignore_errors=True)
            self._cert_dir = None

    def replica(self) -> ForeignEpp:
        """Another process of this command (not started) for the same pool, with the same flags,
        environment and serving certificate: a second pod of one Deployment behind one Service name.
        This one must be started first (it makes the certificate) and closed last (it removes it)."""
        if self._cert_dir is None:
            raise RuntimeError("start the first replica before making another (it owns the certificate)")
        other = dataclasses.replace(self)
        other._cert_dir, other._ca_pem, other._owns_cert_dir = self._cert_dir, self._ca_pem, False
        return other

    # ---- what the harness reads ------------------------------------------------------------------

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
    def ext_proc_address(self) -> str:
        return f"{LOOPBACK}:{self.grpc_port}"

    @property
    def debug_url(self) -> str | None:
        """Our EPP's ``/debug/datastore`` base URL; None for other EPPs (they have no such view)."""
        if "debug" not in self._ports:
            return None
        return f"http://{LOOPBACK}:{self._ports['debug'].port}"

    def health(self, service: str | None = None) -> str:
        """gRPC health of ``service``; by default the one of the EPP's dialect that says the pool is known."""
        name = self.command.flags.health_service if service is None else service
        return epp_probe.health(f"{LOOPBACK}:{self.health_port}", name)

    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines) if self._process is not None else ""
