"""One namespace's worth of cluster for reproducing EPP behaviour through the API server.

A `TestBed` owns: objects in one namespace (pools, models, pods created through the real API), the
kubelet stand-in that reports pod status, one model-server simulator per pod on its own loopback
address, the EPP under test, and the consistency oracle. The integration suite and `harness replay`
drive the same methods, so a scenario written in YAML and one written in Python mean the same thing.

Nothing here touches the EPP's datastore: state goes in through the API server and the simulators'
HTTP endpoints, and comes out through ext_proc, health, /metrics and /debug/datastore.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from harness.addresses import AddressPool
from harness.builders import ModelBuilder, PodBuilder, PoolBuilder
from harness.epp_inprocess import EppInProcess, EppSettings
from harness.eventually import eventually
from harness.extproc_client import ExtProcResult
from harness.kube import Kube
from harness.kubelet import Kubelet
from harness.oracle import Verdict, compare, expected_state, observed_state
from harness.sim import ModelServerSim, SimConfig, SimThread

DEFAULT_POOL = "pool"
DEFAULT_PORT = 8000
DEFAULT_APP_LABEL = "app"


@dataclass
class SimulatedPod:
    name: str
    ip: str
    labels: dict[str, str]
    sims: dict[int, SimThread] = field(default_factory=dict)  # port -> running simulator

    def sim(self, port: int) -> ModelServerSim:
        return self.sims[port].sim


class TestBed:
    """Drives one namespace; `close()` stops simulators and the EPP and frees addresses."""

    __test__ = False  # not a pytest class, despite the name

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        kubeconfig: Path,
        *,
        pool_name: str = DEFAULT_POOL,
        sim_config: SimConfig | None = None,
        refresh_interval: float = 0.05,
        staleness_threshold: float = 2.0,
    ) -> None:
        self.namespace = namespace
        self.pool_name = pool_name
        self.kube = Kube(api_client)
        self.kubelet = Kubelet(api_client)
        self.sim_config = sim_config or SimConfig(model="base-model", time_scale=0.01)
        self.pods: dict[str, SimulatedPod] = {}
        self._addresses = AddressPool()
        self._port = DEFAULT_PORT
        self.epp = EppInProcess(
            EppSettings(
                pool_name=pool_name,
                pool_namespace=namespace,
                kubeconfig=kubeconfig,
                refresh_interval=refresh_interval,
                staleness_threshold=staleness_threshold,
            )
        )
        self._epp_running = False

    # ------------------------------------------------------------------ lifecycle
    def start_epp(self) -> None:
        self.epp.start()
        self._epp_running = True

    def stop_epp(self) -> None:
        if self._epp_running:
            self._epp_running = False
            self.epp.stop()

    def restart_epp(self) -> None:
        self.stop_epp()
        self.start_epp()

    def close(self) -> None:
        try:
            self.stop_epp()
        finally:
            for pod in self.pods.values():
                for sim in pod.sims.values():
                    sim.stop()
            self.pods.clear()
            self._addresses.release_all()

    def __enter__(self) -> TestBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ pools and models
    def apply_pool(
        self,
        selector: Mapping[str, str] | None = None,
        port: int = DEFAULT_PORT,
        name: str | None = None,
    ) -> dict[str, Any]:
        """Create the pool, or replace its spec if it exists (selector and port changes)."""
        name = name or self.pool_name
        body = (
            PoolBuilder(name)
            .namespace(self.namespace)
            .selector(dict(selector or {DEFAULT_APP_LABEL: name}))
            .port(port)
            .extension_ref("epp")
            .build()
        )
        if name == self.pool_name:
            self._port = port
        existing = self._get_or_none(self.kube.pools.list(self.namespace), name)
        if existing is None:
            return self.kube.pools.create(self.namespace, body)
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        return self.kube.pools.replace(self.namespace, body)

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
    ) -> dict[str, Any]:
        builder = (
            ModelBuilder(name)
            .namespace(namespace or self.namespace)
            .model_name(model_name or name)
            .pool(pool or self.pool_name)
        )
        if criticality:
            builder = builder.criticality(criticality)
        for target, weight in targets:
            builder = builder.target(target, weight=weight)
        body = builder.build()
        ns = namespace or self.namespace
        existing = self._get_or_none(self.kube.models.list(ns), name)
        if existing is None:
            return self.kube.models.create(ns, body)
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        return self.kube.models.replace(ns, body)

    def delete_model(self, name: str, namespace: str | None = None) -> None:
        self.kube.models.delete(namespace or self.namespace, name)

    # ------------------------------------------------------------------ pods
    def add_pod(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        *,
        ready: bool = True,
        sim_config: SimConfig | None = None,
    ) -> SimulatedPod:
        """A pod through the API, a simulator on a fresh address, and the kubelet reporting Running."""
        ip = self._addresses.acquire()
        pod = SimulatedPod(name, ip, dict(labels or {DEFAULT_APP_LABEL: self.pool_name}))
        self.pods[name] = pod
        self._start_sim(pod, self._port, sim_config)
        body = PodBuilder(name).namespace(self.namespace).labels(pod.labels).build()
        self.kubelet.start(self.namespace, body, ip, ready=ready)
        return pod

    def serve_port(self, pod_name: str, port: int, sim_config: SimConfig | None = None) -> ModelServerSim:
        """Also run a simulator on another port of the pod's address (a pool port change)."""
        pod = self.pods[pod_name]
        if port not in pod.sims:
            self._start_sim(pod, port, sim_config)
        return pod.sim(port)

    def pod_ready(self, name: str) -> None:
        self.kubelet.make_ready(self.namespace, name, self.pods[name].ip)

    def pod_unready(self, name: str) -> None:
        self.kubelet.make_unready(self.namespace, name)

    def pod_move(self, name: str) -> str:
        """Give the pod a new address in place (its simulators move with it)."""
        pod = self.pods[name]
        old_ip, ports = pod.ip, list(pod.sims)
        self._stop_sims(pod)
        pod.ip = self._addresses.acquire()
        for port in ports:
            self._start_sim(pod, port, None)
        self.kubelet.change_ip(self.namespace, name, pod.ip)
        self._addresses.release(old_ip)
        return pod.ip

    def pod_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch labels (None removes a label)."""
        self.kube.pods.patch(self.namespace, name, {"metadata": {"labels": dict(labels)}})
        pod = self.pods[name]
        for key, value in labels.items():
            if value is None:
                pod.labels.pop(key, None)
            else:
                pod.labels[key] = value

    def pod_hold_and_delete(self, name: str) -> None:
        """Delete while a finalizer holds the pod: deletionTimestamp set, object still there."""
        self.kubelet.finalize_and_delete(self.namespace, name)

    def pod_release(self, name: str) -> None:
        self.kubelet.release(self.namespace, name)
        self._forget(name)

    def delete_pod(self, name: str) -> None:
        self.kubelet.delete(self.namespace, name)
        self._forget(name)

    def pod_recreate(self, name: str) -> str:
        """Delete the pod and create it again under the same name with a new address."""
        labels = dict(self.pods[name].labels)
        self.delete_pod(name)
        eventually(lambda: self._assert_pod_gone(name), timeout=10, message=f"pod {name} deleted")
        return self.add_pod(name, labels).ip

    def set_gauges(self, name: str, **gauges: Any) -> None:
        for sim in self.pods[name].sims.values():
            sim.sim.set_gauges(**gauges)

    def pod_for_endpoint(self, endpoint: str | None) -> str | None:
        if endpoint is None:
            return None
        ip = endpoint.rsplit(":", 1)[0]
        return next((p.name for p in self.pods.values() if p.ip == ip), None)

    # ------------------------------------------------------------------ requests
    def route(
        self,
        model: str | None,
        prompt: str = "hello",
        *,
        body: bytes | None = None,
        chunks: int = 1,
        headers: Mapping[str, str] | None = None,
        bodyless: bool = False,
    ) -> ExtProcResult:
        client_ = self.epp.ext_proc()
        if bodyless:
            from harness.extproc_client import request_headers

            return client_.route(None, headers=headers or request_headers("/v1/models", method="GET"))
        if body is None:
            payload: dict[str, Any] = {"prompt": prompt, "max_tokens": 4}
            if model is not None:
                payload["model"] = model
            return client_.route(payload, headers=headers, chunks=chunks)
        return client_.route(body, headers=headers, chunks=chunks)

    # ------------------------------------------------------------------ the oracle
    def verdict(self) -> Verdict:
        pools = [p for p in self.kube.pools.list(self.namespace) if p["metadata"]["name"] == self.pool_name]
        expected = expected_state(
            pools[0] if pools else None,
            self.kube.models.list(self.namespace),
            self.kube.pods.list(self.namespace),
            self.namespace,
            self.pool_name,
        )
        return compare(expected, observed_state(self.epp.datastore_view()))

    def eventually_consistent(self, timeout: float = 15.0) -> Verdict:
        def check() -> Verdict:
            verdict = self.verdict()
            assert verdict.consistent, verdict.summary()
            return verdict

        return eventually(check, timeout=timeout, message="datastore consistent with the API server")

    # ------------------------------------------------------------------ internals
    def _start_sim(self, pod: SimulatedPod, port: int, config: SimConfig | None) -> None:
        sim = ModelServerSim(host=pod.ip, port=port, config=config or self.sim_config)
        pod.sims[port] = SimThread(sim).start()

    def _stop_sims(self, pod: SimulatedPod) -> None:
        for sim in pod.sims.values():
            sim.stop()
        pod.sims.clear()

    def _forget(self, name: str) -> None:
        pod = self.pods.pop(name, None)
        if pod is not None:
            self._stop_sims(pod)
            self._addresses.release(pod.ip)

    def _assert_pod_gone(self, name: str) -> None:
        names = [p["metadata"]["name"] for p in self.kube.pods.list(self.namespace)]
        assert name not in names, f"pod {name} still exists"

    @staticmethod
    def _get_or_none(items: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
        return next((i for i in items if i["metadata"]["name"] == name), None)
