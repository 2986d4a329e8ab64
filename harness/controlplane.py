"""A real, throw-away Kubernetes control plane: etcd + kube-apiserver as child processes.

Modelled on controller-runtime envtest (``reference/envtest.md`` §0/§1): etcd first, then
kube-apiserver; ready means ``/readyz`` is OK *and* the ``default`` namespace exists (RBAC bootstrap
has run); a partial start is rolled back; stop goes in reverse order and removes the temp dir. Admin
access is a client certificate in ``system:masters``, embedded in a kubeconfig written next to the
processes' logs. Usable as a plain context manager; the pytest plugin and ``harness up`` only wrap it.

Flags beyond envtest's: ``--endpoint-reconciler-type=none`` (as Kubernetes' own integration tests;
no Endpoints for the ``kubernetes`` Service, so no advertise-address validation or default-route
dependency) and ``--advertise-address=127.0.0.1`` so the host needs no default route.
"""

from __future__ import annotations

import functools
import shutil
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import yaml

from harness import certs
from harness.binaries import etcd_path
from harness.kube_apiserver_build import ensure_kube_apiserver
from harness.ports import LOOPBACK, PortReservation, reserve_port
from harness.process import (
    DetachedProcess,
    ManagedProcess,
    http_health_check,
    stop_detached,
    temp_prefix,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

DEFAULT_START_TIMEOUT: Final = 60.0
DEFAULT_STOP_TIMEOUT: Final = 20.0
SERVICE_CLUSTER_IP_RANGE: Final = "10.0.0.0/24"
ADMIN_USER: Final = "admin"
ADMIN_GROUP: Final = "system:masters"
_LOG_TAIL_LINES: Final = 30
_SERVING_DNS_NAMES: Final = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
_SERVING_IPS: Final = (LOOPBACK, "10.0.0.1")


class ControlPlaneStartError(RuntimeError):
    """The control plane did not come up; the message ends with the tail of both logs."""


@dataclass(frozen=True)
class ClusterAccess:
    """How to reach an API server: a kubeconfig, plus the PEM files behind it when we made them."""

    kubeconfig_path: Path
    server_url: str
    ca_cert_path: Path | None = None
    client_cert_path: Path | None = None
    client_key_path: Path | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path) -> ClusterAccess:
        """Access to the current context of an existing kubeconfig (e.g. a real cluster)."""
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
        clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
        context = contexts[config["current-context"]]
        return cls(Path(path), str(clusters[context["cluster"]]["server"]))

    def api_client(self) -> ApiClient:
        """A new ``kubernetes.client.ApiClient`` (the caller closes it)."""
        from kubernetes import client

        if self.ca_cert_path and self.client_cert_path and self.client_key_path:
            configuration = client.Configuration()
            configuration.host = self.server_url
            configuration.ssl_ca_cert = str(self.ca_cert_path)
            configuration.cert_file = str(self.client_cert_path)
            configuration.key_file = str(self.client_key_path)
            return client.ApiClient(configuration)
        stat = self.kubeconfig_path.stat()
        return client.ApiClient(_kubeconfig_configuration(str(self.kubeconfig_path), stat.st_mtime_ns))

    def to_json(self) -> dict[str, str | None]:
        return {k: (str(v) if v is not None else None) for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterAccess:
        def path(key: str) -> Path | None:
            return Path(data[key]) if data.get(key) else None

        return cls(Path(data["kubeconfig_path"]), str(data["server_url"]), path("ca_cert_path"),
                   path("client_cert_path"), path("client_key_path"))  # fmt: skip


@functools.lru_cache(maxsize=8)
def _kubeconfig_configuration(path: str, mtime_ns: int) -> Configuration:
    """Load a kubeconfig once per file version: the loader writes embedded certs to temp files."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


class ControlPlane:
    """etcd + kube-apiserver (+ our CRDs) for one test run or one ``harness up``."""

    def __init__(
        self,
        *,
        install_crds: bool = True,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        crd_timeout: float = 30.0,
        etcd_binary: Path | None = None,
        kube_apiserver_binary: Path | None = None,
        etcd_port: int | None = None,
        extra_apiserver_args: Sequence[str] = (),
    ) -> None:
        """``etcd_port`` pins etcd's client port instead of reserving a free one (tests use it to
        provoke a port clash); binaries default to the environment's etcd and the cached/built
        kube-apiserver."""
        self.install_crds = install_crds
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.crd_timeout = crd_timeout
        self._etcd_binary = etcd_binary
        self._apiserver_binary = kube_apiserver_binary
        self._etcd_port = etcd_port
        self._extra_apiserver_args = list(extra_apiserver_args)
        self.root: Path | None = None
        self.etcd: ManagedProcess | None = None
        self.apiserver: ManagedProcess | None = None
        self.crds_installed = False
        self._access: ClusterAccess | None = None
        self._ports: list[PortReservation] = []

    # ------------------------------------------------------------------ public surface

    @property
    def access(self) -> ClusterAccess:
        if self._access is None:
            raise RuntimeError("control plane not started")
        return self._access

    @property
    def kubeconfig_path(self) -> Path:
        return self.access.kubeconfig_path

    @property
    def server_url(self) -> str:
        return self.access.server_url

    def api_client(self) -> ApiClient:
        """A new admin ``kubernetes.client.ApiClient`` (the caller closes it)."""
        return self.access.api_client()

    def start(self) -> None:
        """Start etcd, then kube-apiserver, wait until ready, install CRDs; roll back on any failure."""
        if self.root is not None:
            raise RuntimeError("control plane already started")
        try:
            self._start()
        except Exception as exc:
            tails = self._log_tails()
            self.stop()
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ControlPlaneStartError(f"control plane failed to start: {first_line}\n{tails}") from exc
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd; release ports; remove the temp dir. Idempotent."""
        try:
            for process in (self.apiserver, self.etcd):
                if process is not None:
                    process.stop()
        finally:
            for reservation in self._ports:
                reservation.release()
            self._ports.clear()
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
            self._access = None

    def detach(self) -> dict[str, Any]:
        """Leave the control plane running and return the JSON state ``stop_detached`` needs."""
        if self.apiserver is None or self.etcd is None or self.root is None:
            raise RuntimeError("control plane not started")
        state = {
            "access": self.access.to_json(),
            "processes": [self.apiserver.detach().to_json(), self.etcd.detach().to_json()],
            "root": str(self.root),
        }
        for reservation in self._ports:  # the children hold the ports now
            reservation.release()
        self._ports.clear()
        self.root = None
        return state

    @staticmethod
    def stop_detached(state: dict[str, Any], timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """Stop a control plane detached by ``detach()`` (in any process), in order, and clean up."""
        try:
            for process in state["processes"]:
                stop_detached(DetachedProcess.from_json(process), timeout)
        finally:
            shutil.rmtree(state["root"], ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ start-up steps

    def _start(self) -> None:
        etcd_binary = self._etcd_binary or etcd_path()
        apiserver_binary = self._apiserver_binary or ensure_kube_apiserver().path
        self.root = Path(tempfile.mkdtemp(prefix=temp_prefix("cp")))
        etcd_url = self._start_etcd(etcd_binary)
        self._start_apiserver(apiserver_binary, etcd_url)
        if self.install_crds:
            self._install_crds()

    def _start_etcd(self, binary: Path) -> str:
        assert self.root is not None
        client_port = self._etcd_port if self._etcd_port is not None else self._reserve()
        peer_port = self._reserve()
        client_url = f"http://{LOOPBACK}:{client_port}"
        directory = self.root / "etcd"
        directory.mkdir()
        self.etcd = ManagedProcess(
            "etcd",
            binary,
            [
                f"--data-dir={directory / 'data'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls=http://{LOOPBACK}:{peer_port}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            dir=directory,
            health_url=f"{client_url}/health",
            start_timeout=self.start_timeout,
            stop_timeout=self.stop_timeout,
        )
        self.etcd.start()
        return client_url

    def _start_apiserver(self, binary: Path, etcd_url: str) -> None:
        assert self.root is not None
        port = self._reserve()
        server_url = f"https://{LOOPBACK}:{port}"
        directory = self.root / "apiserver"
        pki = directory / "pki"
        pki.mkdir(parents=True)
        files = _write_pki(pki)
        kubeconfig = self.root / "kubeconfig"
        _write_kubeconfig(kubeconfig, server_url, files)
        self._access = ClusterAccess(
            kubeconfig, server_url, files["ca"], files["admin.crt"], files["admin.key"]
        )
        args = [
            f"--etcd-servers={etcd_url}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={files['apiserver.crt']}",
            f"--tls-private-key-file={files['apiserver.key']}",
            f"--secure-port={port}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            "--authorization-mode=RBAC",
            "--endpoint-reconciler-type=none",
            "--disable-admission-plugins=ServiceAccount",
            f"--client-ca-file={files['ca']}",
            f"--service-account-issuer={server_url}/",
            f"--service-account-key-file={files['sa.pub']}",
            f"--service-account-signing-key-file={files['sa.key']}",
            *self._extra_apiserver_args,
        ]
        context = ssl.create_default_context(cafile=str(files["ca"]))
        context.load_cert_chain(files["admin.crt"], files["admin.key"])
        readyz = http_health_check(f"{server_url}/readyz", context)
        default_namespace = http_health_check(f"{server_url}/api/v1/namespaces/default", context)
        self.apiserver = ManagedProcess(
            "kube-apiserver",
            binary,
            args,
            dir=directory,
            health_check=lambda: readyz() and default_namespace(),
            start_timeout=self.start_timeout,
            stop_timeout=self.stop_timeout,
        )
        self.apiserver.start()

    def _install_crds(self) -> None:
        """Install our CRDs through ``harness.crds`` when that module exists (it is optional)."""
        try:
            from harness import crds
        except ModuleNotFoundError as exc:
            if exc.name != "harness.crds":
                raise
            return
        with self.api_client() as api_client:
            crds.install_crds(api_client, timeout=self.crd_timeout)
        self.crds_installed = True

    def _reserve(self) -> int:
        reservation = reserve_port()
        self._ports.append(reservation)
        return reservation.port

    def _log_tails(self) -> str:
        parts = []
        for name, process in (("etcd", self.etcd), ("kube-apiserver", self.apiserver)):
            tail = process.log_tail(_LOG_TAIL_LINES) if process is not None else ""
            parts.append(f"--- {name} log (last {_LOG_TAIL_LINES} lines) ---\n{tail or '(no output)'}")
        return "\n".join(parts)


def _write_pki(directory: Path) -> dict[str, Path]:
    """CA, serving pair, admin client pair and service-account keys, as files with private modes."""
    ca = certs.TinyCA()
    serving = ca.issue_serving(_SERVING_DNS_NAMES, _SERVING_IPS, common_name="kube-apiserver")
    admin = ca.issue_client(ADMIN_USER, [ADMIN_GROUP])
    service_account = certs.service_account_key_pair()
    contents = {
        "ca": ca.cert_pem,
        "apiserver.crt": serving.cert_pem,
        "apiserver.key": serving.key_pem,
        "admin.crt": admin.cert_pem,
        "admin.key": admin.key_pem,
        "sa.pub": service_account.public_pem,
        "sa.key": service_account.private_pem,
    }
    paths = {}
    for name, data in contents.items():
        path = directory / (name if "." in name else f"{name}.crt")
        path.write_bytes(data)
        path.chmod(0o600)
        paths[name] = path
    return paths


def _write_kubeconfig(path: Path, server_url: str, files: dict[str, Path]) -> None:
    """A self-contained kubeconfig (certificate data embedded, so it can be copied anywhere)."""
    import base64

    def embed(name: str) -> str:
        return base64.b64encode(files[name].read_bytes()).decode("ascii")

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "harness", "cluster": {"server": server_url, "certificate-authority-data": embed("ca")}}
        ],
        "users": [
            {
                "name": ADMIN_USER,
                "user": {
                    "client-certificate-data": embed("admin.crt"),
                    "client-key-data": embed("admin.key"),
                },
            }
        ],
        "contexts": [{"name": "harness", "context": {"cluster": "harness", "user": ADMIN_USER}}],
        "current-context": "harness",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    path.chmod(0o600)
