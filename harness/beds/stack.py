"""The whole system as a user runs it: API server objects, pods run by the node agent, the EPP process, Envoy.

`Stack` is what the e2e tests, `harness demo` and `harness up --with-epp` stand up. Pool, models and
pods go through the API server (`harness.beds.cluster.Cluster`); the node agent runs the pods' simulators;
the EPP runs as its own process with a kubeconfig, exactly as in a cluster; clients talk to Envoy's
listener only. What the EPP holds is read through `harness.verdicts.observer.EppObserver`.

Any EPP (``StackOptions.epp_command``, `harness.subject.foreign_epp`): the Stack runs that command line with
upstream's flag names instead of our `EppProcess`. If it has a ``/debug/datastore`` (ours does) the
white-box observer reads it; otherwise (``white_box`` False) membership is judged from traffic by
`harness.verdicts.traffic_oracle.TrafficOracle` (``stack.traffic``), and reading the datastore raises
`NoDatastoreView` with a message saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from epp.config import RECOMMENDED_DESTINATION_FALLBACKS
from harness.base.eventually import eventually
from harness.base.lifecycle import StartStop
from harness.base.ports import LOOPBACK
from harness.beds.cluster import Cluster
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.metrics_access import MetricsReader
from harness.cluster.namespaces import create_namespace
from harness.dataplane.envoy import APP_PROTOCOL_H2C, Envoy, EnvoyOptions
from harness.dataplane.pool_endpoints import PoolEndpointsFollower, pool_app_protocol, pool_fails_open
from harness.sim import SimConfig
from harness.subject.epp_probe import datastore_view
from harness.subject.epp_process import EppProcess
from harness.subject.foreign_epp import EppCommand, ForeignEpp, sim_metric_args
from harness.verdicts.observer import EppObserver
from harness.verdicts.settle import SettleBarrier
from harness.verdicts.traffic_oracle import TrafficOracle

BASE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# How long a Stack waits for another EPP on this host to free a port it always binds (upstream's :8080).
FIXED_PORT_WAIT_S = 900.0
EVIDENCE_REQUESTS = 12
# The capability (`harness.verdicts.departures.CAPABILITIES`) of serving a model name as its targets.
MODEL_AWARE_ROUTING = "model-aware-routing"
EVIDENCE_NOTE = "conformance evidence (the Stack failed to start):"


class NoDatastoreView(RuntimeError):
    """The EPP under test has no ``/debug/datastore`` (any EPP but ours)."""


@dataclass(frozen=True)
class ModelSpec:
    """One InferenceModel: what clients ask for, and what it resolves to."""

    name: str
    model_name: str
    criticality: str | None = None
    targets: tuple[tuple[str, int | None], ...] = ()


# The sample a newcomer sees: a weighted split across two LoRA adapters, a LoRA target, a
# sheddable model, and the base model served directly.
DEMO_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("food-review", "food-review", "Critical", (("food-review-1", 70), ("food-review-2", 30))),
    ModelSpec("sql-lora", "sql-lora", "Critical", (("sql-lora-v1", None),)),
    ModelSpec("summaries-batch", "summaries-batch", "Sheddable", ((BASE_MODEL, None),)),
    ModelSpec("llama", BASE_MODEL, "Standard"),
)
DEMO_ADAPTERS = ("food-review-1", "food-review-2", "sql-lora-v1")


@dataclass
class StackOptions:
    namespace: str
    pool_name: str = "vllm-pool"
    pods: int = 4
    models: Sequence[ModelSpec] = DEMO_MODELS
    sim_config: SimConfig = field(
        default_factory=lambda: SimConfig(
            model=BASE_MODEL, lora_adapters=DEMO_ADAPTERS, max_loras=2, max_num_seqs=8, time_scale=0.05
        )
    )
    envoy: EnvoyOptions = field(default_factory=EnvoyOptions)
    epp_args: Sequence[str] = ()
    epp_env: Mapping[str, str] = field(default_factory=dict)
    # Run this EPP command line instead of our EppProcess (None: ours, as EppProcess runs it).
    epp_command: EppCommand | None = None
    # The model the traffic oracle probes membership with (None: the first model served as the base
    # model, which every pod serves and no LoRA affinity steers).
    probe_model: str | None = None
    # False: the Stack applies no pool, models or pods: the EPP and Envoy serve a pool that a user
    # (kubectl apply of examples/cluster/, a test) creates in the namespace afterwards.
    apply_pool: bool = True
    # How Envoy runs: None is ``Envoy`` (a process); the plugin's ``--envoy=container`` passes a
    # ``harness.dataplane.envoy_container.ContainerEnvoy`` maker (same arguments).
    envoy_factory: Callable[..., Envoy] | None = None
    # The identity the EPP runs as (a kubeconfig, e.g. of a ServiceAccount with a narrow Role); None:
    # the run's admin kubeconfig. The Stack's own writes always go as the admin.
    epp_kubeconfig: Path | None = None
    # The pool's `appProtocol` and its EPP reference's `failureMode` (None: the CRD's defaults, `http`
    # and `FailClose`). Envoy is set up from the pool as applied, as a gateway is: h2c towards the
    # model servers, `failure_mode_allow` for FailOpen.
    app_protocol: str | None = None
    failure_mode: str | None = None


class Stack(StartStop):
    """Start in dependency order; stop in reverse. Usable as a context manager."""

    def __init__(self, access: ClusterAccess, options: StackOptions) -> None:
        self.access = access
        self.options = options
        self.settle_barrier = SettleBarrier()
        self._api: client.ApiClient | None = None
        self.cluster: Cluster | None = None
        self.observer: EppObserver | None = None
        self.epp: EppProcess | None = None  # ours (None when the Stack runs ``epp_command``)
        self.epp_process: EppProcess | ForeignEpp | None = None  # the EPP under test, whichever it is
        self.envoy: Envoy | None = None
        self.pool_endpoints: PoolEndpointsFollower | None = None
        self.traffic: TrafficOracle | None = None
        self._metrics_reader: MetricsReader | None = None

    def _on_failed_start(self, exc: BaseException) -> None:
        if isinstance(exc, Exception):  # what it had seen, before stopping takes it away
            with contextlib.suppress(Exception):
                exc.add_note(f"{EVIDENCE_NOTE}\n{self.evidence()}")

    def _start(self) -> None:
        opts = self.options
        self._api = self.access.api_client()
        _ensure_namespace(self._api, opts.namespace)
        self.cluster = cluster = Cluster(
            self._api, opts.namespace, barrier=self.settle_barrier, pool_name=opts.pool_name,
            sim_config=opts.sim_config,
        )  # fmt: skip
        envoy_options = opts.envoy
        if opts.apply_pool:
            pool = cluster.apply_pool(app_protocol=opts.app_protocol, failure_mode=opts.failure_mode)
            envoy_options = gateway_options(envoy_options, pool)
            for model in opts.models:
                cluster.apply_model(
                    model.name, model.model_name, criticality=model.criticality, targets=model.targets
                )
            cluster.add_pods([cluster.pod_body(f"{opts.pool_name}-{i}") for i in range(opts.pods)])
        body_limit = f"--maxRequestBodyBytes={opts.envoy.buffer_limit_bytes}"
        kubeconfig = opts.epp_kubeconfig or self.access.kubeconfig_path
        process: EppProcess | ForeignEpp
        if opts.epp_command is None:
            self.epp = process = EppProcess(
                opts.pool_name,
                opts.namespace,
                kubeconfig,
                # One body limit for both: Envoy's buffer and the EPP's 413 (epp_args may still override).
                extra_args=[body_limit, *fallback_args(envoy_options), *opts.epp_args],
                extra_env=dict(opts.epp_env),
            )
        else:
            command = opts.epp_command
            process = ForeignEpp(
                command,
                opts.pool_name,
                opts.namespace,
                kubeconfig,
                extra_args=[*sim_metric_args(command), *opts.epp_args],
                ours_args=[body_limit, "--shutdownDelay=0s", *fallback_args(envoy_options)],
                extra_env=dict(opts.epp_env),
                # Fixed ports (upstream's :8080) are shared by every such EPP on the host: wait for
                # the one holding them instead of failing (xdist workers then take turns).
                fixed_port_wait=FIXED_PORT_WAIT_S,
            )
        self.epp_process = process
        process.start()
        debug_url = process.debug_url
        if debug_url is not None:
            view = functools.partial(datastore_view, debug_url)
            self.observer = EppObserver(
                cluster.kube, opts.namespace, opts.pool_name, self.settle_barrier, view
            )
        envoy = envoy_options if opts.epp_command is None else opts.epp_command.envoy_options(envoy_options)
        make_envoy = opts.envoy_factory or Envoy
        self.envoy = make_envoy(process.ext_proc_address, options=envoy, ext_proc_tls=process.ext_proc_tls)
        self.envoy.start()
        if envoy.follow_pool_endpoints:
            self.pool_endpoints = PoolEndpointsFollower(
                cluster.kube, opts.namespace, opts.pool_name, self.envoy.set_model_server_endpoints
            ).start()
        self.traffic = TrafficOracle(self.base_url, cluster, opts.probe_model or self._probe_model())
        if opts.apply_pool:
            self.wait_serving()
            if self.white_box:
                self.wait_pods_scraped(opts.pods)
            else:
                self.traffic.eventually_routes_to(timeout=60.0)

    def model_for(self, model: str) -> str:
        """What a client asks for to reach `model` through this Stack's EPP: `model` itself, or, for an
        EPP that reads no model objects (lwepp: no body rewrite), the pods' base model, which they
        serve as is (any other name is the model server's 404)."""
        opts = self.options
        if opts.epp_command is not None and MODEL_AWARE_ROUTING in opts.epp_command.lacks:
            return opts.sim_config.model
        return model

    def _probe_model(self) -> str | None:
        """The model membership probes ask for (`probe_model`), as this Stack's EPP can serve it."""
        opts = self.options
        probe = probe_model(opts.models, opts.sim_config.model)
        return None if probe is None else self.model_for(probe)

    def stop(self) -> None:
        try:
            if self.pool_endpoints is not None:
                self.pool_endpoints.stop()
                self.pool_endpoints = None
            if self.envoy is not None:
                self.envoy.stop()
                self.envoy = None
        finally:
            try:
                if self.epp_process is not None:
                    self.epp_process.close()
                    self.epp_process = self.epp = None
            finally:
                self.observer = None
                self.traffic = None
                if self._metrics_reader is not None:
                    self._metrics_reader.close()
                    self._metrics_reader = None
                if self.cluster is not None:
                    self.cluster.close()
                    self.cluster = None
                if self._api is not None:
                    self._api.close()  # type: ignore[no-untyped-call]
                    self._api = None

    # ------------------------------------------------------------------ reading the system
    @property
    def base_url(self) -> str:
        """The OpenAI base URL clients use (Envoy's listener)."""
        assert self.envoy is not None
        return f"{self.envoy.base_url}/v1"

    @property
    def white_box(self) -> bool:
        """Whether the EPP under test shows its datastore (``/debug/datastore``); else traffic tells."""
        return self.observer is not None

    @property
    def epp_name(self) -> str:
        opts = self.options
        return "epp (ours)" if opts.epp_command is None else opts.epp_command.name

    @property
    def epp_metrics_url(self) -> str:
        """The EPP's Prometheus endpoint base URL (upstream's wants a bearer token; ours does not)."""
        assert self.epp_process is not None, "the Stack is not started"
        return f"http://{LOOPBACK}:{self.epp_process.metrics_port}"

    def epp_metrics_text(self) -> str:
        """The EPP's Prometheus page, read with a ServiceAccount token (`harness.cluster.metrics_access`):
        upstream's demands one, ours ignores it."""
        if self.epp is not None:
            return self.epp.metrics_text()
        assert self._api is not None, "the Stack is not started"
        if self._metrics_reader is None:
            self._metrics_reader = MetricsReader(self._api, self.options.namespace)
        return self._metrics_reader.metrics_text(self.epp_metrics_url)

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Until the EPP's gRPC health is SERVING (it knows the pool) and ext_proc takes TLS."""
        if self.epp_process is not None:
            self.epp_process.wait_serving(timeout)

    def datastore_view(self) -> dict[str, Any]:
        if self.observer is None:
            raise NoDatastoreView(
                f"{self.epp_name} has no /debug/datastore: use the traffic oracle (stack.traffic) instead"
            )
        return self.observer.view()

    def settled(self, timeout: float = 15.0, *, at: Mapping[str, str | int] | None = None) -> dict[str, Any]:
        """The settle barrier (`EppObserver.settled`) against this Stack's EPP process.

        Writes made through `cluster` are recorded; `at` adds resourceVersions written with kubectl
        (per kind plural, e.g. ``{"pods": rv}``). Call it before any "X did not happen" check.
        """
        if self.observer is None:
            raise NoDatastoreView(
                f"{self.epp_name} has no /debug/datastore to settle on: poll an outcome (stack.traffic)"
            )
        return self.observer.settled(timeout, at=at)

    def dead_processes(self) -> list[str]:
        dead = []
        if self.envoy is not None and not self.envoy.running:
            dead.append("envoy")
        if self.epp_process is not None and not self.epp_process.running:
            dead.append(self.epp_name)
        return dead

    def log_tails(self) -> str:
        parts = []
        if self.epp_process is not None:
            parts.append(f"--- {self.epp_name} log ---\n{self.epp_process.log_tail()}")
        if self.envoy is not None:
            parts.append(f"--- envoy log ---\n{self.envoy.log_tail()}")
        return "\n".join(parts)

    def evidence(self, requests: int = EVIDENCE_REQUESTS) -> str:
        """What a conformance report shows for a failed scenario: the last requests Envoy completed
        (method, path, status, the pod that got it), the traffic oracle's last rounds, and what each
        pod's simulator has counted. Best effort: a part that cannot be read says why."""
        lines = [f"EPP under test: {self.epp_name}"]
        cluster = self.cluster
        if self.envoy is not None:
            entries = self._flushed_access_log()[-requests:]
            lines.append(f"last {len(entries)} requests through Envoy (method path -> status, pod):")
            for entry in entries:
                host = entry.get("upstream_host")
                pod = (cluster.pod_for_endpoint(host) if cluster is not None else None) or host or "no pod"
                lines.append(f"  {entry.get('method')} {entry.get('path')} -> {entry.get('status')}, {pod}")
        if self.traffic is not None:
            for verdict in self.traffic.rounds[-3:]:
                lines.append(f"traffic oracle round: {verdict.summary()}")
        if cluster is not None:
            counts = []
            for name, pod in sorted(cluster.pods.items()):
                try:
                    counts.append(f"{name}={sum(pod.sim().requests_by_model().values())}")
                except OSError as exc:
                    counts.append(f"{name}=? ({type(exc).__name__})")
            lines.append(f"requests each pod's simulator counted: {', '.join(counts) or 'no pods'}")
        return "\n".join(lines)

    def _flushed_access_log(self) -> list[dict[str, Any]]:
        """The access log once it holds every request Envoy completed; what it holds after 5 s
        otherwise (evidence must not turn into a second failure)."""
        envoy = self.envoy
        assert envoy is not None
        try:
            return envoy.flushed_access_log(timeout=5.0)
        except (AssertionError, OSError):
            return envoy.access_log()

    def wait_pods_scraped(self, count: int, timeout: float = 30.0) -> None:
        """Until the EPP holds `count` pods, each with fresh metrics (routing decisions are real)."""

        def scraped() -> None:
            pods = self.datastore_view().get("pods") or []
            fresh = [p for p in pods if p.get("metricsAgeSeconds") is not None]
            assert len(fresh) == count, f"{len(fresh)}/{count} pods scraped"

        eventually(scraped, timeout=timeout, message="EPP scraped every pod")
        self.wait_gateway_follows_pool(timeout)

    def wait_gateway_follows_pool(self, timeout: float = 30.0) -> None:
        """Until a list-aware Envoy holds exactly the pool's endpoints as the API has them now (its
        admin ``/clusters``, not the file the follower wrote). Such an Envoy routes only to hosts it
        holds: a pod the EPP already routes to but Envoy has not applied yet is "no healthy upstream"
        (503). Nothing to wait for when Envoy reads the destination address itself (ORIGINAL_DST)."""
        follower, envoy = self.pool_endpoints, self.envoy
        if follower is None or envoy is None:
            return

        def applied() -> None:
            wanted, held = follower.read(), envoy.cluster_hosts()
            assert held == wanted, f"Envoy holds {list(held)}, the pool has {list(wanted)}"

        eventually(applied, timeout=timeout, message="the gateway follows the pool's endpoints")


def gateway_options(options: EnvoyOptions, pool: Mapping[str, Any]) -> EnvoyOptions:
    """`options` as a gateway sets Envoy up for `pool`: h2c towards the model servers when its
    `appProtocol` says so, fail-open when its EPP reference says FailOpen (else as `options` say)."""
    protocol = (
        APP_PROTOCOL_H2C if pool_app_protocol(pool) == APP_PROTOCOL_H2C else options.model_server_protocol
    )
    fail_open = options.failure_mode_allow or pool_fails_open(pool)
    return dataclasses.replace(options, model_server_protocol=protocol, failure_mode_allow=fail_open)


def fallback_args(options: EnvoyOptions) -> list[str]:
    """Our EPP's flag for the fallbacks a list-aware Envoy walks (none for one that reads one address)."""
    return (
        [f"--destination-endpoint-fallbacks={RECOMMENDED_DESTINATION_FALLBACKS}"]
        if options.list_aware
        else []
    )


def probe_model(models: Sequence[ModelSpec], base_model: str = BASE_MODEL) -> str | None:
    """The model membership probes ask for: one served as the base model (every pod has it; no LoRA
    affinity steers it), Critical/Standard before Sheddable (never shed while a pod exists); None if
    no model is served so."""
    base = [
        m
        for m in models
        if (m.model_name == base_model and not m.targets) or m.targets == ((base_model, None),)
    ]
    return min(base, key=lambda m: m.criticality == "Sheddable").model_name if base else None


def _ensure_namespace(api: client.ApiClient, namespace: str) -> None:
    create_namespace(api, namespace, exist_ok=True)
