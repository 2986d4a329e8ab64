"""The cluster side of a test: one namespace's pools, models and pods, written through the API server.

Pods are run the way a cluster runs them: created through the API, bound by the real scheduler to
the node agent's nodes, started by the agent as simulator processes on their own loopback
addresses, Ready when their readiness probe passes. A test never holds a simulator; it talks to one
over the network, through the simulator's admin port (``harness.sim.SimAdmin``): to pin gauges, to
fail its health endpoint (the readiness probe then takes the pod out of Ready), to black-hole its
scrapes, to read what it received.

Which writes the settle barrier records (``harness.verdicts.settle``). The test's own writes (pools, models,
pod creates, label patches, deletes) through ``kube``; and, because the test asks for them and then
waits for them, the agent's writes that finish a test step: the status write that made a pod Ready
(``add_pod``) or not Ready (``pod_ready``/``pod_unready``), read back from the API once it shows, and
the final deletion of a gracefully deleted pod (``delete_pod``). Whatever the agent writes in the
background without the test asking (probe results of other pods, a restart) is not the test's to
settle on.

Pods the agent never runs — for bugs that need a state no kubelet produces (an address changed in
place, status written directly, a deletion held by a finalizer) — are the ``forged_*`` methods:
stand-in pods (never bound), their simulators in this process, their status written by
``harness.cluster.forged.ForgedKubelet``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.base.addresses import AddressPool
from harness.base.eventually import eventually
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder, SimPodBuilder, objective_headers
from harness.cluster.forged import ForgedKubelet
from harness.cluster.kube import CustomResourceClient, JsonObject, Kube, deleted_by_this_write, response_json
from harness.cluster.namespaces import TEST_LABEL, create_namespace
from harness.cluster.pod_status import container_statuses, is_ready
from harness.cluster.releases import V1, Generation
from harness.sim import ADMIN_PORT_OFFSET, ModelServerSim, SimAdmin, SimConfig, SimThread, sim_args
from harness.verdicts.settle import PODS, SettleBarrier

DEFAULT_POOL: Final = "pool"
DEFAULT_PORT: Final = 8000
DEFAULT_APP_LABEL: Final = "app"
DEFAULT_SIM_CONFIG: Final = SimConfig(model="base-model", time_scale=0.01)
PROBE_PERIOD_S: Final = 0.1
"""How often the agent probes pods made here (a harness annotation: a kubelet's floor is 1 s)."""
POD_TIMEOUT_S: Final = 60.0
"""How long a pod may take to be scheduled, started and probed (a loaded 2-core box is slow)."""
GRACE_S: Final = 30
# What a hung model server stops answering while its HTTP health endpoint still says OK.
HUNG_PATHS: Final = ("/metrics", "/v1/completions", "/v1/chat/completions")


@dataclass
class ClusterPod:
    """A pod this test made, as the test knows it: name, address, ports, and how to reach its simulators."""

    name: str
    ip: str
    labels: dict[str, str]
    ports: tuple[int, ...]
    body: JsonObject = field(repr=False, default_factory=dict)  # what was created (for a re-create)
    forged: bool = False
    sims: dict[int, SimThread] = field(default_factory=dict, repr=False)  # forged pods only

    def sim(self, port: int | None = None) -> SimAdmin:
        """The admin handle of the simulator serving ``port`` (default: the pod's first port)."""
        return SimAdmin(self.ip, self._port(port) + ADMIN_PORT_OFFSET)

    def metrics_text(self, port: int | None = None) -> str:
        """The ``/metrics`` page, read as a scraper reads it (the serving port, at the pod's address)."""
        with urllib.request.urlopen(f"http://{self.ip}:{self._port(port)}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def _port(self, port: int | None) -> int:
        served = self.ports[0] if port is None else port
        if served not in self.ports:
            raise KeyError(f"pod {self.name} serves {self.ports}, not {served}")
        return served


class Cluster:
    """One namespace of the cluster, driven through the API; ``close()`` deletes what it made."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        *,
        barrier: SettleBarrier,
        pool_name: str = DEFAULT_POOL,
        sim_config: SimConfig | None = None,
        pod_timeout: float = POD_TIMEOUT_S,
        generation: Generation | None = None,
    ) -> None:
        self.namespace = namespace
        self.pool_name = pool_name
        self.barrier = barrier
        self.kube = Kube(api_client, on_write=barrier.record, generation=generation)
        self.generation = self.kube.generation
        self.forged = ForgedKubelet(api_client, on_write=barrier.record)
        self.sim_config = sim_config or DEFAULT_SIM_CONFIG
        self.pod_timeout = pod_timeout
        self.pods: dict[str, ClusterPod] = {}
        self.port = DEFAULT_PORT  # the pool's (first) target port as last applied here
        # v1: the InferenceObjective a request for a model names (its oldest claimant's, as applied here).
        self._objectives: dict[str, tuple[str, str]] = {}  # model name -> (namespace, objective name)
        self._addresses = AddressPool()  # forged pods only: the agent gives the others theirs
        self._namespaces: list[str] = []

    def close(self) -> None:
        """Stop forged pods' simulators; delete the pods made here (at once, not awaited) and the
        namespaces made here. The namespace a caller gave is the caller's to delete."""
        core = client.CoreV1Api(self.kube.api_client)
        try:
            for pod in self.pods.values():
                for sim in pod.sims.values():
                    sim.stop()
                with contextlib.suppress(ApiException):
                    if pod.forged:
                        self.forged.release(self.namespace, pod.name)  # a held finalizer would block
                    # Not through `kube`: clean-up is not a write any test settles on.
                    response = core.delete_namespaced_pod(
                        pod.name, self.namespace, grace_period_seconds=0, _preload_content=False
                    )
                    response.read()  # type: ignore[attr-defined]
        finally:
            self.pods.clear()
            self._addresses.release_all()
            for namespace in self._namespaces:
                with contextlib.suppress(ApiException):
                    core.delete_namespace(namespace, _request_timeout=10)
            self._namespaces.clear()

    # ------------------------------------------------------------------ pools and models
    def apply_pool(
        self,
        selector: Mapping[str, str] | None = None,
        port: int | Sequence[int] = DEFAULT_PORT,
        name: str | None = None,
        *,
        app_protocol: str | None = None,
        failure_mode: str | None = None,
    ) -> JsonObject:
        """Create the pool, or replace its spec if it exists (selector and port changes). Several
        ports are a v1 pool's ``targetPorts``; ``app_protocol`` its ``appProtocol`` (v1 only) and
        ``failure_mode`` its EPP reference's ``failureMode`` (both left to the CRD's default if None)."""
        name = name or self.pool_name
        ports = [port] if isinstance(port, int) else list(port)
        builder = (
            PoolBuilder(name)
            .namespace(self.namespace)
            .selector(dict(selector or {DEFAULT_APP_LABEL: name}))
            .ports(*ports)
            .extension_ref("epp", failure_mode=failure_mode)
        )
        if app_protocol is not None:
            builder.app_protocol(app_protocol)
        body = builder.build(self.generation)
        if name == self.pool_name:
            self.port = ports[0]
        existing = _named(self.kube.pools.list(self.namespace), name)
        if existing is None:
            return self.kube.pools.create(self.namespace, body)
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        return self.kube.pools.replace(self.namespace, body)

    def pool_selector(self, name: str | None = None) -> dict[str, str]:
        """The pool's selector as the API holds it (v1: ``spec.selector.matchLabels``)."""
        pool = self.kube.pools.get(self.namespace, name or self.pool_name)
        selector = pool["spec"]["selector"]
        return dict(selector["matchLabels"] if self.generation is V1 else selector)

    def delete_pool(self, name: str | None = None) -> None:
        self.kube.pools.delete(self.namespace, name or self.pool_name)

    def apply_model(
        self,
        name: str,
        model_name: str | None = None,
        *,
        criticality: str | None = None,
        targets: Sequence[tuple[str, int | None]] = (),
        pool: str | None = None,
        namespace: str | None = None,
    ) -> JsonObject:
        """Serve a model as described (``ModelBuilder``): an InferenceModel, or in v1 its rewrite and
        objective. Returns the object that claims the model name (InferenceModel or rewrite)."""
        ns = namespace or self.namespace
        builder = ModelBuilder(name).namespace(ns).model_name(model_name or name).pool(pool or self.pool_name)
        if criticality:
            builder = builder.criticality(criticality)
        for target, weight in targets:
            builder = builder.target(target, weight=weight)
        written = [
            self._apply(self.kube.model_client(kind), ns, body)
            for kind, body in builder.objects(self.generation)
        ]
        if self.generation is V1:
            self._objectives.setdefault(builder.served_model, (ns, name))
        return written[0]

    def delete_model(self, name: str, namespace: str | None = None) -> None:
        ns = namespace or self.namespace
        for kind in self.generation.model_kinds:
            self.kube.model_client(kind).delete(ns, name)
        self._objectives = {m: o for m, o in self._objectives.items() if o != (ns, name)}

    def objective_headers(self, model: str | None) -> dict[str, str]:
        """The headers a request for ``model`` carries so the EPP applies its criticality: in v1 the
        objective's name (``x-gateway-inference-objective``); none in v1alpha2."""
        objective = self._objectives.get(model or "")
        return objective_headers(objective[1] if objective else None, self.generation)

    def objective_headers_of_body(self, content: bytes) -> dict[str, str]:
        """``objective_headers`` for the ``model`` of a JSON request body (what an HTTP client's
        request hook has); none when the body is not a JSON object naming a model."""
        try:
            document = json.loads(content)
        except ValueError:
            return {}
        model = document.get("model") if isinstance(document, dict) else None
        return self.objective_headers(model if isinstance(model, str) else None)

    def _apply(self, resources: CustomResourceClient, namespace: str, body: JsonObject) -> JsonObject:
        existing = _named(resources.list(namespace), str(body["metadata"]["name"]))
        if existing is None:
            return resources.create(namespace, body)
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        return resources.replace(namespace, body)

    # ------------------------------------------------------------------ pods the node agent runs
    def pod_body(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        *,
        ready: bool = True,
        sim_config: SimConfig | None = None,
        ports: Sequence[int] | None = None,
        pre_stop: int | None = None,
        grace: int | None = None,
    ) -> JsonObject:
        """The Pod ``add_pod`` creates: a simulator per port, probed every ``PROBE_PERIOD_S``."""
        args = sim_args(sim_config or self.sim_config)
        builder = SimPodBuilder(name).namespace(self.namespace).labels(dict(self._labels(labels)))
        for port in ports or (self.port,):
            builder = builder.simulator(port, args, healthy=ready)
        if grace is None:  # room for the whole preStop hook, then the usual grace for SIGTERM
            grace = GRACE_S + (pre_stop or 0)
        builder = builder.probe_period(PROBE_PERIOD_S).grace_period(grace)
        if pre_stop is not None:
            builder = builder.pre_stop(pre_stop)
        return builder.build()

    def add_pod(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        *,
        ready: bool = True,
        sim_config: SimConfig | None = None,
        ports: Sequence[int] | None = None,
        pre_stop: int | None = None,
        grace: int | None = None,
    ) -> ClusterPod:
        """Create a pod; return once the agent runs it (Ready, or Running with its probe failing if
        ``ready=False``). ``pre_stop``: seconds of a preStop sleep (the pod stays Ready while deleted)."""
        body = self.pod_body(name, labels, ready=ready, sim_config=sim_config, ports=ports,
                             pre_stop=pre_stop, grace=grace)  # fmt: skip
        return self.add_pods([body], ready=ready)[0]

    def add_pods(
        self, bodies: Sequence[JsonObject], *, ready: bool = True, listening: bool = True
    ) -> list[ClusterPod]:
        """Create every pod first, then wait for all: they start side by side. An unready pod is
        handed back once its simulators answer, unless ``listening=False`` (the moment the API says
        Running: for a test about what a watcher has seen by then)."""
        for body in bodies:
            self.kube.pods.create(self.namespace, body)
        added = []
        for body in bodies:
            name = str(body["metadata"]["name"])
            pod = self._await_running(name, ready=ready)
            ports = tuple(int(c["ports"][0]["containerPort"]) for c in body["spec"]["containers"])
            known = self._remember(name, pod, ports, body)
            if not ready and listening:
                self._await_listening(known)
            added.append(known)
        return added

    def _await_listening(self, pod: ClusterPod) -> None:
        """Until every simulator of a pod that is Running but not Ready answers its admin port.

        Running means the process started, not that it listens yet: a Ready pod proved that through
        its readiness probe, a pod created unready did not, and a test's next call to its simulator
        (``pod_ready``) would be refused while the interpreter is still starting."""
        for port in pod.ports:
            sim = pod.sim(port)
            eventually(
                sim.info,
                timeout=self.pod_timeout,
                retry_on=(ConnectionRefusedError,),
                message=f"the simulator of {pod.name}:{port} listens",
            )

    def _remember(self, name: str, pod: JsonObject, ports: tuple[int, ...], body: JsonObject) -> ClusterPod:
        labels = dict(pod["metadata"].get("labels") or {})
        known = ClusterPod(name, str(pod["status"]["podIP"]), labels, ports, body=body)
        self.pods[name] = known
        return known

    def _await_running(self, name: str, *, ready: bool) -> JsonObject:
        """Until the pod runs (its IP and container started) and is Ready as wanted; record that write."""

        def running() -> JsonObject:
            pod = self.kube.pods.get(self.namespace, name)
            status = pod.get("status") or {}
            waiting = [
                s["state"]["waiting"] for s in container_statuses(pod) if "waiting" in (s.get("state") or {})
            ]
            assert status.get("podIP"), f"pod {name}: no IP yet (phase {status.get('phase')}, {waiting})"
            assert status.get("phase") == "Running", f"pod {name}: phase {status.get('phase')} ({waiting})"
            assert is_ready(pod) == ready, f"pod {name}: Ready is not {ready} yet"
            return pod

        pod = eventually(running, timeout=self.pod_timeout, message=f"the node agent runs pod {name}")
        self.barrier.record(PODS, pod)
        return pod

    def _await_ready(self, name: str, ready: bool) -> JsonObject:
        def flipped() -> JsonObject:
            pod = self.kube.pods.get(self.namespace, name)
            assert is_ready(pod) == ready, f"pod {name}: Ready is not {ready} yet"
            return pod

        pod = eventually(flipped, timeout=self.pod_timeout, message=f"pod {name} Ready={ready}")
        self.barrier.record(PODS, pod)
        return pod

    def pod_ready(self, name: str) -> None:
        """The simulator's health comes back; returns once the readiness probe made the pod Ready."""
        self._agent_pod(name).sim().set_healthy(True)
        self._await_ready(name, True)

    def pod_unready(self, name: str) -> None:
        """The simulator's health fails; returns once the readiness probe took the pod out of Ready."""
        self._agent_pod(name).sim().set_healthy(False)
        self._await_ready(name, False)

    def pod_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch labels (None removes a label)."""
        self.kube.pods.patch(self.namespace, name, {"metadata": {"labels": dict(labels)}})
        pod = self.pods[name]
        for key, value in labels.items():
            if value is None:
                pod.labels.pop(key, None)
            else:
                pod.labels[key] = value

    def terminate_pod(self, name: str) -> JsonObject:
        """Delete gracefully and return at once: the pod is Terminating (deletionTimestamp set); with a
        preStop hook it stays Ready while the hook runs. The agent finishes the deletion."""
        return self.kube.pods.delete(self.namespace, name)

    def delete_pod(self, name: str, *, grace: int | None = None) -> None:
        """Delete (gracefully unless ``grace=0``) and wait until the pod is gone from the API."""
        deleting = self.kube.pods.delete(self.namespace, name, grace_period_seconds=grace)
        self.await_gone(name, deleting)

    def force_delete_pod(self, name: str) -> None:
        """``kubectl delete --grace-period=0 --force``: gone from the API at once; the agent then stops it."""
        self.delete_pod(name, grace=0)

    def await_gone(self, name: str, deleting: JsonObject) -> None:
        """Until the pod (as ``deleting`` left it) is gone; that deletion is recorded for settling."""
        if not deleted_by_this_write(deleting):  # graceful: the node's kubelet makes the last delete
            gone = self.kube.pods.wait_deleted(self.namespace, deleting, timeout=int(self.pod_timeout))
            # None: gone so long ago that its revision is lost with the server's watch history. Then
            # there is nothing to record, and nothing is lost: the delete that began it (recorded) set
            # the deletionTimestamp that takes the pod out of the datastore; the last delete only
            # removes what a correct EPP no longer holds.
            if gone is not None:
                self.barrier.record(PODS, gone)
        self._forget(name)

    def pod_recreate(self, name: str) -> str:
        """Delete the pod, wait until it is gone, create it again under the same name: its new address."""
        pod = self.pods[name]
        body = copy.deepcopy(pod.body)
        body["metadata"]["labels"] = dict(pod.labels)
        self.delete_pod(name)
        return self.add_pods([body])[0].ip

    def kill_container(self, name: str, port: int | None = None) -> int:
        """SIGKILL the simulator process (found through its admin port), as a crash would; its pid."""
        pid = self._agent_pod(name).sim(port).pid
        os.kill(pid, signal.SIGKILL)
        return pid

    def set_gauges(self, name: str, *, port: int | None = None, **gauges: Any) -> None:
        """Pin the gauges of the pod's simulators (``ModelServerSim.set_gauges`` keywords).

        With ``port``, only the simulator on that port: a pod serving on two ports then reports
        different numbers on each, which shows which port the EPP scrapes.
        """
        pod = self.pods[name]
        for served in [port] if port is not None else pod.ports:
            pod.sim(served).set_gauges(**gauges)

    def pod_stop_serving(self, name: str, port: int | None = None) -> None:
        """The pod's model server hangs: scrapes and generation never answer, while ``/health`` still
        does, so the pod stays Ready in the API with its address (a stuck engine behind a live HTTP
        server). No API event."""
        pod = self.pods[name]
        for served in [port] if port is not None else pod.ports:
            pod.sim(served).black_hole(HUNG_PATHS)

    def sim(self, name: str, port: int | None = None) -> SimAdmin:
        return self.pods[name].sim(port)

    def pod_for_endpoint(self, endpoint: str | None) -> str | None:
        if endpoint is None:
            return None
        ip = endpoint.rsplit(":", 1)[0]
        return next((p.name for p in self.pods.values() if p.ip == ip), None)

    # ------------------------------------------------------------------ forged pods (never run by the agent)
    def add_forged_pod(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        *,
        ready: bool = True,
        sim_config: SimConfig | None = None,
        ports: Sequence[int] | None = None,
    ) -> ClusterPod:
        """A stand-in pod (never bound) with simulators in this process and a forged Running status."""
        ip = self._addresses.acquire()
        pod = ClusterPod(name, ip, dict(self._labels(labels)), tuple(ports or (self.port,)), forged=True)
        self.pods[name] = pod
        for port in pod.ports:
            self._start_forged_sim(pod, port, sim_config)
        body = PodBuilder(name).namespace(self.namespace).labels(pod.labels).build()
        self.forged.start(self.namespace, body, ip, ready=ready)
        return pod

    def forged_ready(self, name: str) -> None:
        """Status written directly: Ready (no probe involved)."""
        self.forged.make_ready(self.namespace, name, self._forged_pod(name).ip)

    def forged_unready(self, name: str) -> None:
        self.forged.make_unready(self.namespace, name)

    def forged_move(self, name: str) -> str:
        """A new address in place, on the same pod object (no kubelet does this); the simulators move."""
        pod = self._forged_pod(name)
        old_ip = pod.ip
        self._stop_forged_sims(pod)
        pod.ip = self._addresses.acquire()
        for port in pod.ports:
            self._start_forged_sim(pod, port, None)
        self.forged.change_ip(self.namespace, name, pod.ip)
        self._addresses.release(old_ip)
        return pod.ip

    def forged_server_dies(self, name: str) -> None:
        """The pod's model servers die (their listeners close: a connection is refused, as after a
        crash) and no kubelet reports it — a lost node — so the pod stays Ready in the API."""
        self._stop_forged_sims(self._forged_pod(name))

    def forged_hold_and_delete(self, name: str) -> None:
        """Delete while a finalizer holds the pod: deletionTimestamp set, object still there."""
        self._forged_pod(name)
        self.forged.finalize_and_delete(self.namespace, name)

    def forged_release(self, name: str) -> None:
        self._forged_pod(name)
        self.forged.release(self.namespace, name)
        self._forget(name)

    def _start_forged_sim(self, pod: ClusterPod, port: int, config: SimConfig | None) -> None:
        sim = ModelServerSim(pod.ip, port, config or self.sim_config, admin_port=port + ADMIN_PORT_OFFSET)
        pod.sims[port] = SimThread(sim).start()

    def _stop_forged_sims(self, pod: ClusterPod) -> None:
        for sim in pod.sims.values():
            sim.stop()
        pod.sims.clear()

    # ------------------------------------------------------------------ the API server itself
    def server_time(self) -> str:
        """The API server's clock, as a creationTimestamp (RFC 3339, whole seconds) of a throwaway object."""
        core = client.CoreV1Api(self.kube.api_client)
        body = client.V1ConfigMap.model_validate({"metadata": {"generateName": "clock-"}})
        created = response_json(
            core.create_namespaced_config_map(self.namespace, body, _preload_content=False)
        )
        core.delete_namespaced_config_map(created["metadata"]["name"], self.namespace)
        return str(created["metadata"]["creationTimestamp"])

    def eventually_server_time_after(self, timestamp: str, timeout: float = 5.0) -> str:
        """Wait until the API server stamps new objects later than ``timestamp`` (1 s resolution)."""

        def later() -> str:
            now = self.server_time()
            assert now > timestamp, f"server time {now} not yet after {timestamp}"
            return now

        return eventually(later, timeout=timeout, interval=0.1, message="API server clock moved on")

    def create_namespace(self, suffix: str) -> str:
        """Another namespace named after this one; deleted (without waiting) at close."""
        name = f"{self.namespace}-{suffix}"
        create_namespace(self.kube.api_client, name, TEST_LABEL)
        self._namespaces.append(name)
        return name

    # ------------------------------------------------------------------ internals
    def _labels(self, labels: Mapping[str, str] | None) -> Mapping[str, str]:
        return labels if labels is not None else {DEFAULT_APP_LABEL: self.pool_name}

    def _agent_pod(self, name: str) -> ClusterPod:
        pod = self.pods[name]
        if pod.forged:
            raise ValueError(f"pod {name} is forged (never run by the agent): use the forged_* methods")
        return pod

    def _forged_pod(self, name: str) -> ClusterPod:
        pod = self.pods[name]
        if not pod.forged:
            raise ValueError(f"pod {name} is run by the node agent; forged_* methods need add_forged_pod")
        return pod

    def _forget(self, name: str) -> None:
        pod = self.pods.pop(name, None)
        if pod is not None and pod.forged:
            self._stop_forged_sims(pod)
            self._addresses.release(pod.ip)


def _named(items: Sequence[JsonObject], name: str) -> JsonObject | None:
    return next((i for i in items if i["metadata"]["name"] == name), None)
