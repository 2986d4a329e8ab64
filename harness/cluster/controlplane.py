"""A real, throw-away Kubernetes control plane: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager as child processes.

Modelled on controller-runtime envtest (``reference/envtest.md`` §0/§1) and extended to the parts
envtest leaves out, so a Deployment applied with kubectl really gets a ReplicaSet and pods bound to
nodes, namespaces really finish deleting, and every namespace gets its ``default`` ServiceAccount:

* etcd first, then kube-apiserver; ready means ``/readyz`` is OK *and* the ``default`` namespace
  exists (RBAC bootstrap has run). Then, in the full plane, the scheduler and the controller-manager
  start side by side, each with its own client-certificate identity (``system:kube-scheduler``,
  ``system:kube-controller-manager``: the users RBAC's bootstrap policy already binds), ready by
  their ``/healthz``, and the node agent (``harness.nodeagent``: the cluster's kubelets, one process
  running every pod bound to its nodes) under its own identity ``epp-harness:node-agent``, bound by
  the plane to a ClusterRole with what a kubelet needs, ready once its nodes are schedulable; the
  plane is ready once the ``default`` ServiceAccount of the ``default`` namespace exists (the
  controllers are working).
* The ServiceAccount admission plugin is on exactly when the controller-manager runs (as in a real
  cluster); the minimal plane (etcd + apiserver, for fast test tiers) keeps it off like envtest,
  because nothing would create the ServiceAccounts that pods need.
* A partial start is rolled back; stop goes in reverse order and removes the temp dir
  (``harness.base.process.ChildProcesses``). The CA (with its key) is kept in the plane's PKI directory,
  so ``harness.cluster.identities`` can mint a kubeconfig for any user and groups.

The scheduler and the controller-manager get ``--kube-api-qps=1000`` (as envtest's own client): at
the default 20 QPS the controller-manager, which creates a ServiceAccount and requests a token for
each of its ~40 controllers, took 5 s longer to start.

Flags beyond envtest's: ``--endpoint-reconciler-type=none`` (as Kubernetes' own integration tests;
no Endpoints for the ``kubernetes`` Service, so no advertise-address validation or default-route
dependency) and ``--advertise-address=127.0.0.1`` so the host needs no default route.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import ssl
import sys
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self

import yaml

from harness.base.lifecycle import StartStop
from harness.base.ports import LOOPBACK
from harness.base.process import ChildProcesses, ManagedProcess, http_health_check
from harness.cluster import certs
from harness.cluster.go_binaries import binary_path

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

DEFAULT_START_TIMEOUT: Final = 60.0
DEFAULT_STOP_TIMEOUT: Final = 20.0
SERVICE_CLUSTER_IP_RANGE: Final = "10.0.0.0/24"
ADMIN_USER: Final = "admin"
ADMIN_GROUP: Final = "system:masters"

ETCD: Final = "etcd"
KUBE_APISERVER: Final = "kube-apiserver"
KUBE_SCHEDULER: Final = "kube-scheduler"
KUBE_CONTROLLER_MANAGER: Final = "kube-controller-manager"
NODE_AGENT: Final = "node-agent"
MINIMAL: Final = (ETCD, KUBE_APISERVER)
"""etcd + kube-apiserver: objects and watches only (envtest's plane), for fast test tiers."""
CONTROLLERS: Final = (*MINIMAL, KUBE_SCHEDULER, KUBE_CONTROLLER_MANAGER)
"""The scheduler and the controllers too, but no kubelets: pods are bound and never run."""
FULL: Final = (*CONTROLLERS, NODE_AGENT)
"""A cluster: the scheduler, the controllers, and the node agent that runs the pods on its nodes."""
NODE_AGENT_USER: Final = "epp-harness:node-agent"
DEFAULT_NODES: Final = 4

_IDENTITIES: Final = {
    KUBE_SCHEDULER: "system:kube-scheduler",
    KUBE_CONTROLLER_MANAGER: "system:kube-controller-manager",
}
_LOG_TAIL_LINES: Final = 30
_SERVING_DNS_NAMES: Final = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
_SERVING_IPS: Final = (LOOPBACK, "10.0.0.1")


class ControlPlaneStartError(RuntimeError):
    """The control plane did not come up; the message ends with the tail of every component's log."""


@dataclass(frozen=True)
class ClusterAccess:
    """How to reach an API server: a kubeconfig, plus the PEM files behind it when we made them.

    ``ca_key_path`` is set for planes the harness started: with it, client certificates for other
    identities can be minted (``harness.cluster.identities``).
    """

    kubeconfig_path: Path
    server_url: str
    ca_cert_path: Path | None = None
    client_cert_path: Path | None = None
    client_key_path: Path | None = None
    ca_key_path: Path | None = None
    node_agent_url: str | None = None  # the node agent's /healthz and /debug/pods, when the plane runs one
    # The container engine the node agent runs our images in (its directory), when it has one.
    container_engine: Path | None = None

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
                   path("client_cert_path"), path("client_key_path"), path("ca_key_path"),
                   data.get("node_agent_url"), path("container_engine"))  # fmt: skip


@functools.lru_cache(maxsize=8)
def _kubeconfig_configuration(path: str, mtime_ns: int) -> Configuration:
    """Load a kubeconfig once per file version: the loader writes embedded certs to temp files."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


class ControlPlane(StartStop):
    """etcd + kube-apiserver (+ kube-scheduler + kube-controller-manager + node agent) (+ the CRDs)."""

    def __init__(
        self,
        *,
        components: Collection[str] = FULL,
        install_crds: bool = True,
        crd_release: str | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        crd_timeout: float = 30.0,
        binaries: Mapping[str, Path] | None = None,
        etcd_port: int | None = None,
        extra_apiserver_args: Sequence[str] = (),
        nodes: int = DEFAULT_NODES,
        container_engine: Path | None = None,
    ) -> None:
        """``components`` is ``FULL`` (default), ``CONTROLLERS``, ``MINIMAL``, or any set containing
        both of ``MINIMAL``'s (the node agent also needs the scheduler and the controller-manager).
        ``binaries`` overrides the path of a component's binary (default: the environment / cache /
        build of ``harness.cluster.go_binaries``). ``etcd_port`` pins etcd's client port instead of reserving
        a free one (tests use it to provoke a port clash). ``nodes``: how many Nodes the agent runs.
        ``container_engine``: the directory of a running ``DockerEngine`` (its owner starts and stops
        it); the node agent runs our images as containers there (``harness.nodeagent.containers``)."""
        unknown = set(components) - set(FULL)
        if unknown or not set(MINIMAL) <= set(components):
            raise ValueError(f"components must include {MINIMAL} and be among {FULL}, got {components}")
        if NODE_AGENT in components and not set(CONTROLLERS) <= set(components):
            raise ValueError(f"the node agent needs {CONTROLLERS[2:]} too, got {components}")
        self.components = tuple(c for c in FULL if c in components)
        self.install_crds = install_crds
        self.crd_release = crd_release
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.crd_timeout = crd_timeout
        self._binaries = dict(binaries or {})
        self._etcd_port = etcd_port
        self._extra_apiserver_args = list(extra_apiserver_args)
        self.nodes = nodes
        self.container_engine = container_engine
        self.root: Path | None = None
        self.etcd: ManagedProcess | None = None
        self.apiserver: ManagedProcess | None = None
        self.scheduler: ManagedProcess | None = None
        self.controller_manager: ManagedProcess | None = None
        self.node_agent: ManagedProcess | None = None
        self.crds_installed = False
        self._access: ClusterAccess | None = None
        self._pki: dict[str, Path] = {}
        self._children = ChildProcesses()
        self._etcd_url = ""
        self._apiserver_ready: Callable[[], bool] | None = None

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

    @property
    def processes(self) -> list[ManagedProcess]:
        """The component processes started so far, in start order."""
        return self._children.processes

    @property
    def runs_controllers(self) -> bool:
        return KUBE_CONTROLLER_MANAGER in self.components

    def api_client(self) -> ApiClient:
        """A new admin ``kubernetes.client.ApiClient`` (the caller closes it)."""
        return self.access.api_client()

    def start(self) -> Self:
        """Start every component in order, wait until ready, install CRDs; roll back on any failure."""
        if self.root is not None:
            raise RuntimeError("control plane already started")
        try:
            self._start()
        except Exception as exc:
            tails = self.log_tails()
            self.stop()
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ControlPlaneStartError(f"control plane failed to start: {first_line}\n{tails}") from exc
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the components in reverse order; release ports; remove the temp dir. Idempotent."""
        try:
            self._children.close()
        finally:
            self.root = None
            self._access = None

    def dead_processes(self) -> list[str]:
        """Components that were started and have exited since."""
        return self._children.dead()

    def log_tails(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The end of every component's log (also for components that never started), for errors."""
        named = {ETCD: self.etcd, KUBE_APISERVER: self.apiserver, KUBE_SCHEDULER: self.scheduler,
                 KUBE_CONTROLLER_MANAGER: self.controller_manager, NODE_AGENT: self.node_agent}  # fmt: skip
        parts = []
        for name in self.components:
            process = named[name]
            tail = process.log_tail(lines) if process is not None else ""
            parts.append(f"--- {name} log (last {lines} lines) ---\n{tail or '(no output)'}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ faults
    # Fault tests start a plane of their own and break it on purpose (never the shared one: other
    # tests use it at the same time). A restarted component gets the same data dir, ports,
    # certificates and flags; its previous log is kept as `<name>.log.<n>`.

    def restart_apiserver(self) -> None:
        """SIGTERM kube-apiserver (it ends every watch), start it again; return once ready."""
        self.stop_apiserver()
        self.start_apiserver()

    def stop_apiserver(self) -> None:
        self._component_process(self.apiserver).stop()

    def start_apiserver(self) -> None:
        """Start the stopped kube-apiserver again and wait for /readyz and the default namespace."""
        _relaunch(self._component_process(self.apiserver))

    def restart_etcd(self) -> None:
        """SIGTERM etcd, start it again on its data, and return once kube-apiserver is ready again."""
        etcd = self._component_process(self.etcd)
        etcd.stop()
        _relaunch(etcd)
        self.wait_apiserver_ready()

    def wait_apiserver_ready(self, timeout: float | None = None) -> None:
        """Until kube-apiserver's /readyz passes (its storage checks included)."""
        apiserver, ready = self._component_process(self.apiserver), self._apiserver_ready
        assert ready is not None
        apiserver.wait_for(ready, "ready", timeout)

    def etcd_revision(self) -> int:
        """etcd's current revision (the newest resourceVersion), from its HTTP gateway."""
        header = self._etcd_call("/v3/maintenance/status", {})["header"]
        return int(header["revision"])

    def compact_etcd(self, revision: int | None = None) -> int:
        """Compact etcd's history before `revision` (default: the current one) and return it.

        A watch from an older resourceVersion that reaches etcd then gets 410 Gone. kube-apiserver
        serves watches from its watch cache, which keeps its own window of history, so a test that
        wants the 410 starts the plane with `extra_apiserver_args=["--watch-cache-sizes=pods#0"]`
        (pods watched straight from etcd, as every resource is once the cache's window has passed).
        """
        target = self.etcd_revision() if revision is None else revision
        self._etcd_call("/v3/kv/compaction", {"revision": str(target), "physical": True})
        return target

    def _etcd_call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self._etcd_url:
            raise RuntimeError("control plane not started")
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(
            self._etcd_url + path, data=json.dumps(body).encode(), headers=headers
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer

    @staticmethod
    def _component_process(process: ManagedProcess | None) -> ManagedProcess:
        if process is None:
            raise RuntimeError("control plane not started")
        return process

    # ------------------------------------------------------------------ start-up steps

    def _binary(self, component: str) -> Path:
        return self._binaries.get(component) or binary_path(component)

    def _start(self) -> None:
        binaries = {
            component: self._binary(component) for component in self.components if component != NODE_AGENT
        }
        self._children = ChildProcesses()
        self.root = self._children.temp_dir("cp")
        self._pki = _write_pki(self.root / "pki")
        etcd_url = self._start_etcd(binaries[ETCD])
        self._start_apiserver(binaries[KUBE_APISERVER], etcd_url)
        if KUBE_SCHEDULER in self.components:
            self.scheduler = self._component(KUBE_SCHEDULER, binaries[KUBE_SCHEDULER], [])
        if KUBE_CONTROLLER_MANAGER in self.components:
            self.controller_manager = self._component(
                KUBE_CONTROLLER_MANAGER,
                binaries[KUBE_CONTROLLER_MANAGER],
                [
                    f"--service-account-private-key-file={self._pki['sa.key']}",
                    f"--root-ca-file={self._pki['ca.crt']}",
                    "--use-service-account-credentials=true",
                    f"--cluster-signing-cert-file={self._pki['ca.crt']}",
                    f"--cluster-signing-key-file={self._pki['ca.key']}",
                    f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                ],
            )
        if NODE_AGENT in self.components:
            self.node_agent = self._node_agent()
        launched = [p for p in (self.scheduler, self.controller_manager, self.node_agent) if p is not None]
        for process in launched:
            self._children.launch(process)  # side by side, and CRDs meanwhile: each needs only the API server
        if self.install_crds:
            from harness.cluster import crds

            with self.api_client() as api_client:
                crds.install_crds(api_client, timeout=self.crd_timeout, release=self.crd_release)
            self.crds_installed = True
        for process in launched:
            process.wait_until_healthy()
        if self.runs_controllers:
            self._wait_for_default_service_account()

    def _start_etcd(self, binary: Path) -> str:
        assert self.root is not None
        client_port = self._etcd_port if self._etcd_port is not None else self._reserve()
        peer_port = self._reserve()
        client_url = f"http://{LOOPBACK}:{client_port}"
        directory = self.root / ETCD
        directory.mkdir()
        self.etcd = self._children.add(ManagedProcess(
            ETCD,
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
        ))  # fmt: skip
        self.etcd.start()
        self._etcd_url = client_url
        return client_url

    def _start_apiserver(self, binary: Path, etcd_url: str) -> None:
        assert self.root is not None
        port = self._reserve()
        server_url = f"https://{LOOPBACK}:{port}"
        directory = self.root / KUBE_APISERVER
        directory.mkdir()
        pki = self._pki
        kubeconfig = self.root / "kubeconfig"
        admin_cert, admin_key = pki["admin.crt"].read_bytes(), pki["admin.key"].read_bytes()
        write_kubeconfig(kubeconfig, server_url, pki["ca.crt"].read_bytes(), ADMIN_USER,
                         client_cert=admin_cert, client_key=admin_key)  # fmt: skip
        self._access = ClusterAccess(
            kubeconfig, server_url, pki["ca.crt"], pki["admin.crt"], pki["admin.key"], pki["ca.key"]
        )
        # Without the controller-manager nobody creates the ServiceAccounts the admission plugin
        # would require of every pod, so the minimal plane turns it off (as envtest does).
        admission = [] if self.runs_controllers else ["--disable-admission-plugins=ServiceAccount"]
        args = [
            f"--etcd-servers={etcd_url}",
            f"--cert-dir={directory}",
            f"--tls-cert-file={pki['apiserver.crt']}",
            f"--tls-private-key-file={pki['apiserver.key']}",
            f"--secure-port={port}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            "--authorization-mode=Node,RBAC",
            "--endpoint-reconciler-type=none",
            *admission,
            f"--client-ca-file={pki['ca.crt']}",
            f"--service-account-issuer={server_url}/",
            f"--service-account-key-file={pki['sa.pub']}",
            f"--service-account-signing-key-file={pki['sa.key']}",
            *self._extra_apiserver_args,
        ]
        context = self._admin_ssl_context()
        readyz = http_health_check(f"{server_url}/readyz", context)
        default_namespace = http_health_check(f"{server_url}/api/v1/namespaces/default", context)
        self._apiserver_ready = readyz
        self.apiserver = self._children.add(  # named before it starts: a failed start shows its log
            ManagedProcess(
                KUBE_APISERVER,
                binary,
                args,
                dir=directory,
                health_check=lambda: readyz() and default_namespace(),
                start_timeout=self.start_timeout,
                stop_timeout=self.stop_timeout,
            )
        )
        self.apiserver.start()

    def _component(self, name: str, binary: Path, extra_args: list[str]) -> ManagedProcess:
        """kube-scheduler or kube-controller-manager: its own identity, loopback only, no leader election."""
        assert self.root is not None
        assert self._access is not None
        directory = self.root / name
        directory.mkdir()
        ca = certs.TinyCA.load(self._pki["ca.crt"].read_bytes(), self._pki["ca.key"].read_bytes())
        identity = ca.issue_client(_IDENTITIES[name])
        serving = ca.issue_serving(["localhost"], [LOOPBACK], common_name=name)
        for file, data in (("serving.crt", serving.cert_pem), ("serving.key", serving.key_pem)):
            _write_private(directory / file, data)
        kubeconfig = directory / "kubeconfig"
        write_kubeconfig(kubeconfig, self._access.server_url, ca.cert_pem, _IDENTITIES[name],
                         client_cert=identity.cert_pem, client_key=identity.key_pem)  # fmt: skip
        port = self._reserve()
        context = ssl.create_default_context(cafile=str(self._pki["ca.crt"]))
        return ManagedProcess(
            name,
            binary,
            [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--tls-cert-file={directory / 'serving.crt'}",
                f"--tls-private-key-file={directory / 'serving.key'}",
                "--leader-elect=false",
                "--kube-api-qps=1000",
                "--kube-api-burst=2000",
                *extra_args,
            ],
            dir=directory,
            health_check=http_health_check(f"https://{LOOPBACK}:{port}/healthz", context),
            start_timeout=self.start_timeout,
            stop_timeout=self.stop_timeout,
        )

    def _wait_for_default_service_account(self) -> None:
        """The ServiceAccount controller has created ``default/default``: the controllers are at work."""
        assert self._access is not None
        url = f"{self._access.server_url}/api/v1/namespaces/default/serviceaccounts/default"
        check = http_health_check(url, self._admin_ssl_context())
        assert self.controller_manager is not None  # raced against its exit, like its health check
        self.controller_manager.wait_for(check, "ready (no default ServiceAccount yet)")

    def _admin_ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self._pki["ca.crt"]))
        context.load_cert_chain(self._pki["admin.crt"], self._pki["admin.key"])
        return context

    def _node_agent(self) -> ManagedProcess:
        """The cluster's kubelets: ``python -m harness.nodeagent`` under its own identity."""
        assert self.root is not None
        assert self._access is not None
        directory = self.root / NODE_AGENT
        directory.mkdir()
        ca = certs.TinyCA.load(self._pki["ca.crt"].read_bytes(), self._pki["ca.key"].read_bytes())
        identity = ca.issue_client(NODE_AGENT_USER)
        kubeconfig = directory / "kubeconfig"
        write_kubeconfig(kubeconfig, self._access.server_url, ca.cert_pem, NODE_AGENT_USER,
                         client_cert=identity.cert_pem, client_key=identity.key_pem)  # fmt: skip
        with self.api_client() as api_client:
            grant_node_agent(api_client, NODE_AGENT_USER)
        port = self._reserve()
        url = f"http://{LOOPBACK}:{port}"
        self._access = dataclasses.replace(
            self._access, node_agent_url=url, container_engine=self.container_engine
        )
        engine = [f"--container-engine={self.container_engine}"] if self.container_engine else []
        return ManagedProcess(
            NODE_AGENT,
            sys.executable,
            [
                "-m",
                "harness.nodeagent",
                f"--kubeconfig={kubeconfig}",
                f"--state-dir={directory / 'state'}",
                f"--nodes={self.nodes}",
                f"--health-port={port}",
                *engine,
            ],
            dir=directory,
            health_url=f"{url}/healthz",
            start_timeout=self.start_timeout,
            stop_timeout=self.stop_timeout,
        )

    def _reserve(self) -> int:
        return self._children.reserve_port()


_ALL: Final = ["get", "list", "watch", "create", "update", "patch", "delete"]
_READ: Final = ["get", "list", "watch"]
NODE_AGENT_RULES: Final = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": _ALL},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "update", "patch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": _ALL},
    {"apiGroups": [""], "resources": ["pods"], "verbs": [*_READ, "delete"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "update", "patch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "update", "patch"]},
    {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["configmaps", "secrets", "services"], "verbs": _READ},
)
"""What a kubelet may do (the Node authorizer's grants, for N nodes under one identity)."""


def grant_node_agent(api_client: ApiClient, user: str) -> None:
    """ClusterRole ``epp-harness:node-agent`` and its binding to ``user`` (created or replaced)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    rbac = client.RbacAuthorizationV1Api(api_client)
    name = NODE_AGENT_USER
    role = client.V1ClusterRole.model_validate({"metadata": {"name": name}, "rules": list(NODE_AGENT_RULES)})
    binding = client.V1ClusterRoleBinding.model_validate(
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )
    writes: list[tuple[Any, Any, Any]] = [
        (rbac.create_cluster_role, rbac.replace_cluster_role, role),
        (rbac.create_cluster_role_binding, rbac.replace_cluster_role_binding, binding),
    ]
    for create, replace, body in writes:
        try:
            create(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            replace(name, body)


def _relaunch(process: ManagedProcess) -> None:
    """Start a stopped component again with the same arguments, keeping its previous log."""
    log = process.log_path
    if log.exists():
        generation = 1
        while log.with_name(f"{log.name}.{generation}").exists():
            generation += 1
        log.rename(log.with_name(f"{log.name}.{generation}"))
    process.start()


def _write_pki(directory: Path) -> dict[str, Path]:
    """CA (with its key, for minting identities later), serving pair, admin client pair, SA keys."""
    directory.mkdir(parents=True)
    ca = certs.TinyCA()
    serving = ca.issue_serving(_SERVING_DNS_NAMES, _SERVING_IPS, common_name=KUBE_APISERVER)
    admin = ca.issue_client(ADMIN_USER, [ADMIN_GROUP])
    service_account = certs.service_account_key_pair()
    contents = {
        "ca.crt": ca.cert_pem,
        "ca.key": ca.key_pem,
        "apiserver.crt": serving.cert_pem,
        "apiserver.key": serving.key_pem,
        "admin.crt": admin.cert_pem,
        "admin.key": admin.key_pem,
        "sa.pub": service_account.public_pem,
        "sa.key": service_account.private_pem,
    }
    paths = {}
    for name, data in contents.items():
        paths[name] = directory / name
        _write_private(paths[name], data)
    return paths


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def write_kubeconfig(
    path: Path,
    server_url: str,
    ca_pem: bytes,
    user: str,
    *,
    client_cert: bytes | None = None,
    client_key: bytes | None = None,
    token: str | None = None,
) -> None:
    """A self-contained kubeconfig (certificates embedded, so it can be copied anywhere) for one user,
    authenticated by a client certificate or a bearer token."""

    def embed(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    credentials: dict[str, str] = {}
    if client_cert is not None and client_key is not None:
        credentials = {"client-certificate-data": embed(client_cert), "client-key-data": embed(client_key)}
    if token is not None:
        credentials["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "harness",
                "cluster": {"server": server_url, "certificate-authority-data": embed(ca_pem)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "harness", "context": {"cluster": "harness", "user": user}}],
        "current-context": "harness",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    path.chmod(0o600)
