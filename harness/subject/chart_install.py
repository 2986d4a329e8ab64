"""The chart installed for real into the harness's cluster, with Envoy in front of the EPP pods.

``helm install`` (the real helm, ``harness.cluster.helm``) puts the Deployment, Service, ServiceAccount,
Role, RoleBinding and InferencePool in a namespace; the real controller-manager makes the EPP pods,
the scheduler binds them, the node agent runs each one as the Containerfile's ENTRYPOINT with the
pod's projected ServiceAccount token (``harness.nodeagent.epp_image``), so each EPP loads the
in-cluster configuration and runs under the chart's ServiceAccount and its Role. Envoy's ext_proc
cluster lists the EPP pods' addresses (``pod IP:9002``), checks each one's gRPC health port (9003)
and retries a stream that could not start on another replica, as ``harness.beds.epp_replicas`` does for
EPP processes. The chart's pool is of the session's API generation (``inferencePool.apiVersion``), and
the model servers are that generation's example (``Generation.example_manifest``: the Deployment and
its InferenceModels, or its InferenceModelRewrite and InferenceObjectives; the example's
InferencePool is left out: the chart makes the pool).

**The image.** ``ChartOptions.epp_image`` names the EPP image. By default it is
``epp-harness/inference-epp:dev``, which no engine has: the node agent runs it as the Containerfile's
ENTRYPOINT from this virtualenv (a process). With the container tier, it is the image built from
this checkout (``harness.nodeagent.image_builds``, ``epp-harness/inference-epp:<content hash>``)
and the plane's node agent has an engine: then each EPP pod is that image as a real container, under
the chart's securityContext, with the projected token mounted where a kubelet mounts it
(``harness.nodeagent.containers``).

Envoy follows the pods as a gateway follows the Service's EndpointSlices: ``EndpointsFollower``
lists the EPP pods (every 0.25 s) and rewrites Envoy's ext_proc endpoints (file-based EDS,
``EnvoyOptions.ext_proc_dynamic_endpoints``) to the pods whose Ready condition is True — a terminating
pod stays listed while it is still Ready ("serving", as an EndpointSlice says), so its streams in
flight finish — and a pod the Deployment makes later gets streams once it is Ready.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes import client

from harness.base.eventually import eventually
from harness.base.lifecycle import StartStop
from harness.base.shipped import shipped_path
from harness.cluster.certs import UNVERIFIED_EXT_PROC_TLS
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.helm import Helm
from harness.cluster.kube import response_json
from harness.cluster.kubectl import kubectl
from harness.cluster.pod_status import is_ready
from harness.cluster.releases import V1, Generation, session_generation
from harness.dataplane.envoy import Envoy, EnvoyOptions, ExtProcHealthCheck, ExtProcReplica

POOL: Final = "vllm-llama3-8b-instruct"
"""The release name, so the pool's name (the example's models point at it)."""
BASE_MODEL: Final = "meta-llama/Llama-3.1-8B-Instruct"
EPP_IMAGE_HUB: Final = "epp-harness"
PROCESS_EPP_IMAGE: Final = f"{EPP_IMAGE_HUB}/inference-epp:dev"
"""The image no engine has: the node agent runs the EPP from this virtualenv."""
EXT_PROC_PORT: Final = 9002
HEALTH_PORT: Final = 9003
METRICS_PORT: Final = 9090
MODEL_SERVER_PORT: Final = 8000
READY_TIMEOUT_S: Final = 120.0


@dataclass(frozen=True)
class ChartOptions:
    release: str = POOL
    replicas: int = 2
    # `inferenceExtension.flags` (upstream's map: `--name value` each), e.g. ("shutdown-delay", "2s").
    flags: Sequence[tuple[str, str]] = ()
    # The pool's API generation (the chart's `inferencePool.apiVersion`); default: the session's.
    generation: Generation = field(default_factory=session_generation)
    model_server_replicas: int = 2
    # Extra simulator flags for the model servers (appended to the example's args).
    model_server_args: Sequence[str] = ("--max-num-seqs=64", "--time-scale=0.5")
    health_check: ExtProcHealthCheck = field(
        default_factory=lambda: ExtProcHealthCheck(interval_s=0.5, timeout_s=1.0)
    )
    ext_proc_retries: int = 1
    # registry/repository:tag of the EPP pods' image (see the module doc).
    epp_image: str = PROCESS_EPP_IMAGE
    # `inferenceExtension.resources` (requests and limits), e.g. for the container runtime's cgroups.
    epp_resources: Mapping[str, Any] | None = None


def chart_values(options: ChartOptions) -> dict[str, Any]:
    """The values the harness installs with: the image the node agent knows, the example's labels,
    the pool in ``options.generation``."""
    pool: dict[str, Any] = {
        "apiVersion": options.generation.pool_api_version,
        "modelServers": {"matchLabels": {"app": POOL}},
    }
    if options.generation is V1:
        pool["targetPorts"] = [{"number": MODEL_SERVER_PORT}]
    else:
        pool["targetPortNumber"] = MODEL_SERVER_PORT
    name, _, tag = options.epp_image.rpartition(":")
    registry, _, repository = name.rpartition("/")
    return {
        "inferenceExtension": {
            "replicas": options.replicas,
            "image": {"registry": registry, "repository": repository, "tag": tag},
            "flags": dict(options.flags),
            **({"resources": dict(options.epp_resources)} if options.epp_resources else {}),
        },
        "inferencePool": pool,
    }


def model_server_manifest(options: ChartOptions, example: Path | None = None) -> str:
    """The generation's example without its pool: the Deployment (replicas and args adjusted) and the
    kinds that serve its models."""
    example = example or shipped_path(options.generation.example_manifest)
    documents = [d for d in yaml.safe_load_all(example.read_text(encoding="utf-8")) if isinstance(d, dict)]
    kept = []
    for document in documents:
        if document.get("kind") == "InferencePool":
            continue
        if document.get("kind") == "Deployment":
            document["spec"]["replicas"] = options.model_server_replicas
            container = document["spec"]["template"]["spec"]["containers"][0]
            container["args"] = [*container.get("args", []), *options.model_server_args]
        kept.append(document)
    return yaml.safe_dump_all(kept)


class ChartInstall(StartStop):
    """The chart installed in ``namespace`` (which must exist) plus model servers and an Envoy."""

    def __init__(
        self,
        access: ClusterAccess,
        namespace: str,
        work_dir: Path,
        options: ChartOptions = ChartOptions(),
        helm: Helm | None = None,
    ) -> None:
        self.access = access
        self.namespace = namespace
        self.options = options
        self.work_dir = work_dir
        self.helm = helm or Helm(work_dir / "helm-home", kubeconfig=access.kubeconfig_path)
        self.envoy: Envoy | None = None
        self.follower: EndpointsFollower | None = None
        self.installed_at: float | None = None  # time.monotonic() when `helm install` was started
        self._installed = False

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        self.apply_model_servers()
        self.install()
        self.start_envoy(self.wait_epp_ready())

    def apply_model_servers(self) -> None:
        self.kubectl("apply", "-f", "-", stdin=model_server_manifest(self.options))

    def install(self) -> str:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        values = self.work_dir / "values.yaml"
        values.write_text(yaml.safe_dump(chart_values(self.options)), encoding="utf-8")
        self.installed_at = time.monotonic()
        self._installed = True
        return self.helm.install(self.options.release, self.namespace, values=[values])

    def start_envoy(self, pods: Sequence[Mapping[str, Any]]) -> Envoy:
        endpoints = epp_endpoints(pods)
        options = EnvoyOptions(
            ext_proc_health_check=self.options.health_check,
            ext_proc_retries=self.options.ext_proc_retries,
            ext_proc_dynamic_endpoints=True,
        )
        self.envoy = Envoy(endpoints, options=options, ext_proc_tls=UNVERIFIED_EXT_PROC_TLS)
        self.envoy.start()
        self.follower = EndpointsFollower(self, self.envoy)
        self.follower.start()
        return self.envoy

    def stop(self) -> None:
        """Stop Envoy, uninstall the release, delete the model servers; wait until their pods are gone."""
        try:
            if self.follower is not None:
                self.follower.stop()
                self.follower = None
            if self.envoy is not None:
                self.envoy.stop()
                self.envoy = None
        finally:
            if self._installed:
                self._installed = False
                with contextlib.suppress(Exception):
                    self.helm.uninstall(self.options.release, self.namespace)
            with contextlib.suppress(Exception):
                self.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false",
                             stdin=model_server_manifest(self.options))  # fmt: skip
            with contextlib.suppress(AssertionError):
                eventually(self._no_pods_left, timeout=READY_TIMEOUT_S, message="the release's pods gone")

    # ------------------------------------------------------------------ reading the cluster
    @property
    def epp_name(self) -> str:
        return f"{self.options.release}-epp"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of the Envoy in front of the EPP pods."""
        assert self.envoy is not None, "not started"
        return f"{self.envoy.base_url}/v1"

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return kubectl(self.access.kubeconfig_path, *args, namespace=self.namespace, stdin=stdin)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        answer = json.loads(self.kubectl("get", "pods", "-l", selector, "-o", "json"))
        return list(answer["items"])

    def epp_pods(self) -> list[dict[str, Any]]:
        """The EPP Deployment's pods (any phase, terminating ones too)."""
        return self.pods(f"inferencepool={self.epp_name}")

    def serving_epp_pods(self) -> list[dict[str, Any]]:
        """EPP pods that are Ready (gRPC health SERVING per the node agent's probe) and not deleted."""
        return [p for p in self.epp_pods() if is_ready(p) and not p["metadata"].get("deletionTimestamp")]

    def wait_epp_ready(
        self, count: int | None = None, timeout: float = READY_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` (default: the replicas) EPP pods and every model server are Ready."""
        wanted = self.options.replicas if count is None else count
        found: list[dict[str, Any]] = []

        def ready() -> None:
            nonlocal found
            servers = [p for p in self.pods(f"app={POOL}") if is_ready(p)]
            assert len(servers) >= self.options.model_server_replicas, f"{len(servers)} model servers Ready"
            found = self.serving_epp_pods()
            assert len(found) >= wanted, f"{len(found)} of {wanted} EPP pods Ready"

        eventually(ready, timeout=timeout, message=f"{wanted} EPP pods Ready")
        return found

    def _no_pods_left(self) -> None:
        left = [p["metadata"]["name"] for p in self.epp_pods() + self.pods(f"app={POOL}")]
        assert not left, f"pods still there: {left}"


def pod_ip(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("podIP") or "")


def epp_endpoints(pods: Sequence[Mapping[str, Any]]) -> list[ExtProcReplica]:
    """The ext_proc endpoints of these pods: every Ready one with an address, terminating or not."""
    ready = sorted(pod_ip(p) for p in pods if is_ready(p) and pod_ip(p))
    return [ExtProcReplica(f"{ip}:{EXT_PROC_PORT}", HEALTH_PORT) for ip in ready]


class EndpointsFollower:
    """Keeps Envoy's ext_proc endpoints equal to the Ready EPP pods (a thread; ``stop()`` joins it)."""

    def __init__(self, install: ChartInstall, envoy: Envoy, interval: float = 0.25) -> None:
        self._install = install
        self._envoy = envoy
        self._interval = interval
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epp-endpoints", daemon=True)
        self.updates = 0  # endpoint sets written after the first (read by tests)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        install = self._install
        selector = f"inferencepool={install.epp_name}"
        with install.access.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            current = list(self._envoy.ext_proc_replicas)
            while not self._stopping.wait(self._interval):
                try:
                    response = core.list_namespaced_pod(
                        install.namespace,
                        label_selector=selector,
                        _preload_content=False,
                        _request_timeout=10,
                    )
                    pods = response_json(response)["items"]
                except Exception:  # the API server restarting: keep the endpoints Envoy has
                    continue
                wanted = epp_endpoints(pods)
                if wanted != current:
                    self._envoy.set_ext_proc_replicas(wanted)
                    current = wanted
                    self.updates += 1
