"""The EPP image run as a real container, the way the chart's Deployment runs it.

``deploy/chart/templates/deployment.yaml`` asks for: the image's own user (``runAsNonRoot``; the
Containerfile's ``USER 65532``), ``readOnlyRootFilesystem``, ``capabilities.drop: [ALL]``,
``allowPrivilegeEscalation: false``, the RuntimeDefault seccomp profile, a 16 MiB in-memory ``/tmp``,
and the chart's flags (pool, namespace, pool group, the three ports). ``ChartSecurity`` is that, as
``docker run`` flags; a test may pass another one (a planted defect) through the constructor.

Networking keeps the harness's loopback pod-IP model: ``--network host``, and the EPP binds its
servers to an address of its own (``--bindAddress``, as the node agent tells an EPP pod), so the
chart's fixed ports (9002, 9003, 9090) are used as they are. The EPP reaches the API server through a
kubeconfig mounted read-only, with the credentials inlined (the key files of the harness's plane are
root's, and the image's user is not).
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from harness.base.addresses import AddressPool
from harness.base.eventually import eventually
from harness.base.process import ChildProcesses
from harness.cluster.container_engine import ENGINE_LABEL, DockerCommandError, DockerEngine
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.releases import session_generation
from harness.subject import epp_probe

EXT_PROC_PORT: Final = 9002  # the chart's defaults (values.yaml), also the Containerfile's EXPOSE
HEALTH_PORT: Final = 9003
METRICS_PORT: Final = 9090
KUBECONFIG_IN_CONTAINER: Final = "/etc/epp/kubeconfig"


@dataclass(frozen=True)
class ChartSecurity:
    """The Deployment's pod and container securityContext and its ``/tmp`` volume, as docker flags."""

    read_only_root: bool = True
    drop_capabilities: bool = True
    no_new_privileges: bool = True
    tmp_size: str = "16m"  # emptyDir medium: Memory, sizeLimit: 16Mi

    def run_flags(self) -> list[str]:
        flags = ["--security-opt", "no-new-privileges"] if self.no_new_privileges else []
        if self.read_only_root:
            flags.append("--read-only")
        if self.drop_capabilities:
            flags += ["--cap-drop", "ALL"]
        return [*flags, "--tmpfs", f"/tmp:rw,nosuid,nodev,size={self.tmp_size}"]


def inline_kubeconfig(access: ClusterAccess) -> str:
    """A kubeconfig for ``access`` with its CA and client credentials inline (no file references)."""

    def data(path: Path | None) -> str:
        assert path is not None, (
            "the plane's kubeconfig has no PEM files (a cluster the harness did not start)"
        )
        return base64.b64encode(path.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "harness", "cluster": {
            "server": access.server_url, "certificate-authority-data": data(access.ca_cert_path)}}],
        "users": [{"name": "harness", "user": {
            "client-certificate-data": data(access.client_cert_path),
            "client-key-data": data(access.client_key_path)}}],
        "contexts": [{"name": "harness", "context": {"cluster": "harness", "user": "harness"}}],
        "current-context": "harness",
    }  # fmt: skip
    return yaml.safe_dump(config)


@dataclass
class EppContainer:
    """``docker run`` of the EPP image for one pool; ``close()`` removes the container."""

    engine: DockerEngine
    image: str
    access: ClusterAccess
    pool_name: str
    pool_namespace: str
    security: ChartSecurity = field(default_factory=ChartSecurity)
    extra_args: Sequence[str] = ()
    _kept: ChildProcesses = field(default_factory=ChildProcesses, init=False)
    _addresses: AddressPool = field(default_factory=AddressPool, init=False)
    address: str = field(default="", init=False)
    name: str = field(default="", init=False)

    def start(self) -> None:
        self._kept.defer(self._addresses.release_all)
        self.address = self._addresses.acquire()
        config_dir = self._kept.temp_dir("epp-container")
        config_dir.chmod(0o755)
        kubeconfig = config_dir / "kubeconfig"
        kubeconfig.write_text(inline_kubeconfig(self.access))
        kubeconfig.chmod(0o644)  # the image's user reads it: a test identity, in a temp dir
        self.name = f"epp-{uuid.uuid4().hex[:10]}"
        args = [
            "--poolName", self.pool_name,
            "--poolNamespace", self.pool_namespace,
            "--pool-group", session_generation().pool_group,
            "--grpcPort", str(EXT_PROC_PORT),
            "--grpcHealthPort", str(HEALTH_PORT),
            "--metricsPort", str(METRICS_PORT),
            "--bindAddress", self.address,
            "--debugBindAddress", self.address,
            "--kubeconfig", KUBECONFIG_IN_CONTAINER,
            *self.extra_args,
        ]  # fmt: skip
        self._kept.defer(self._remove)
        self.engine.docker(
            "run", "--detach", "--name", self.name,
            "--label", f"{ENGINE_LABEL}={self.engine.dir}",
            "--network", "host",
            *self.security.run_flags(),
            "--volume", f"{kubeconfig}:{KUBECONFIG_IN_CONTAINER}:ro",
            self.image, *args,
        )  # fmt: skip

    def _remove(self) -> None:
        if self.name:
            with contextlib.suppress(DockerCommandError):
                self.engine.docker("rm", "--force", "--volumes", self.name, timeout=60)

    def close(self) -> None:
        self._kept.close()

    def __enter__(self) -> EppContainer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading it

    @property
    def ext_proc_address(self) -> str:
        return f"{self.address}:{EXT_PROC_PORT}"

    def health(self, service: str = "") -> str:
        return epp_probe.health(f"{self.address}:{HEALTH_PORT}", service)

    def state(self) -> dict[str, Any]:
        """``docker inspect``'s State (Running, ExitCode ...)."""
        found: list[dict[str, Any]] = json.loads(self.engine.docker("inspect", self.name))
        return dict(found[0]["State"])

    def logs(self) -> str:
        return self.engine.docker("logs", "--tail", "40", self.name, check=False)

    def wait_serving(self, timeout: float = 60.0) -> None:
        """gRPC health SERVING on the health port (pool synced), and ext_proc answering TLS with h2."""

        def serving() -> None:
            state = self.state()
            assert state["Running"], f"the EPP container is not running: {state}\n{self.logs()}"
            try:
                status = self.health()
                epp_probe.tls_handshake(self.ext_proc_address, b"", "")
            except Exception as exc:
                raise AssertionError(f"not serving yet: {exc!r}") from exc
            assert status == "SERVING", f"health {status}"

        eventually(
            serving, timeout=timeout, message=f"EPP container {self.name} serving pool {self.pool_name}"
        )

    def exec(self, *command: str, user: str | None = None) -> tuple[int, str]:
        """Run ``command`` in the container (as its user, or ``user``); exit code and output."""
        as_user = ["--user", user] if user is not None else []
        try:
            return 0, self.engine.docker("exec", *as_user, self.name, *command)
        except DockerCommandError as exc:
            return 1, str(exc)
