"""One namespace's worth of cluster for reproducing EPP behaviour through the API server.

A `TestBed` owns: objects in one namespace (pools, models, pods created through the real API), the
kubelet stand-in that reports pod status, one model-server simulator per pod on its own loopback
address, the EPP under test, and the consistency oracle. The integration suite and `harness replay`
drive the same methods, so a scenario written in YAML and one written in Python mean the same thing.

Nothing here touches the EPP's datastore: state goes in through the API server and the simulators'
HTTP endpoints, and comes out through ext_proc, health, /metrics and /debug/datastore.

Every write made through `kube` and `kubelet` is recorded by the settle barrier (`harness.settle`):
`settled()` waits until the EPP has applied them all and is idle, and `eventually_consistent()`
settles first, so whatever a test asserts after it — "nothing changed" included — is about a
datastore that has seen the test's last write.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from epp.config import DEFAULT_WATCH_BOOKMARK_INTERVAL
from epp.k8s.controllers import Reconcilers
from harness.addresses import AddressPool
from harness.builders import ModelBuilder, PodBuilder, PoolBuilder
from harness.epp_inprocess import EppInProcess, EppSettings
from harness.eventually import eventually
from harness.extproc_client import ExtProcResult, request_headers
from harness.kube import Kube, response_json
from harness.kubelet import Kubelet
from harness.namespaces import TEST_LABEL, create_namespace
from harness.oracle import Verdict, compare, expected_state, observed_state
from harness.settle import SettleBarrier
from harness.sim import ModelServerSim, SimConfig, SimThread

DEFAULT_POOL = "pool"
DEFAULT_PORT = 8000
DEFAULT_APP_LABEL = "app"

# `set_gauges` keyword -> the key of a pod's metrics in the EPP's /debug/datastore view.
_VIEW_KEYS: Final = {
    "waiting": "waitingQueueSize",
    "running": "runningQueueSize",
    "kv_cache": "kvCacheUsagePercent",
    "running_loras": "activeModels",
    "waiting_loras": "waitingModels",
    "max_lora": "maxActiveModels",
}


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
        reconcilers: Reconcilers | None = None,
        watch_bookmark_interval: float = DEFAULT_WATCH_BOOKMARK_INTERVAL,
    ) -> None:
        """`reconcilers`: build the EPP with these instead of the production ones (see EppInProcess).
        `watch_bookmark_interval`: the EPP's watch liveness interval (fault tests shorten it)."""
        self.namespace = namespace
        self.pool_name = pool_name
        self.settle_barrier = SettleBarrier()
        self.kube = Kube(api_client, on_write=self.settle_barrier.record)
        self.kubelet = Kubelet(api_client, on_write=self.settle_barrier.record)
        self.sim_config = sim_config or SimConfig(model="base-model", time_scale=0.01)
        self.pods: dict[str, SimulatedPod] = {}
        self._addresses = AddressPool()
        self._port = DEFAULT_PORT
        self._namespaces: list[str] = []  # created by `create_namespace`, deleted (not awaited) at close
        self.epp = EppInProcess(
            EppSettings(
                pool_name=pool_name,
                pool_namespace=namespace,
                kubeconfig=kubeconfig,
                refresh_interval=refresh_interval,
                staleness_threshold=staleness_threshold,
                watch_bookmark_interval=watch_bookmark_interval,
            ),
            reconcilers=reconcilers,
        )

    # ------------------------------------------------------------------ lifecycle
    def start_epp(self) -> None:
        self.epp.start()

    def stop_epp(self) -> None:
        """Idempotent: safe when the EPP never started or already stopped."""
        self.epp.stop()

    def restart_epp(self) -> None:
        self.epp.restart()

    def close(self) -> None:
        try:
            self.stop_epp()
        finally:
            for pod in self.pods.values():
                for sim in pod.sims.values():
                    sim.stop()
            self.pods.clear()
            self._addresses.release_all()
            core = client.CoreV1Api(self.kube.api_client)
            for namespace in self._namespaces:
                # No namespace controller: it would stay Terminating forever, so never wait for it.
                with contextlib.suppress(ApiException):
                    core.delete_namespace(namespace, _request_timeout=10)
            self._namespaces.clear()

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

    def set_gauges(self, name: str, *, port: int | None = None, **gauges: Any) -> None:
        """Pin the gauges of the pod's simulators (`ModelServerSim.set_gauges` keywords).

        With `port`, only the simulator on that port: a pod serving on two ports then reports
        different numbers on each, which shows which port the EPP scrapes.
        """
        pod = self.pods[name]
        sims = [pod.sims[port]] if port is not None else list(pod.sims.values())
        for sim in sims:
            sim.sim.set_gauges(**gauges)

    def pod_stop_serving(self, name: str, port: int | None = None) -> None:
        """Stop the pod's simulator (on `port`, or all), with no API event: scrapes start failing.

        The pod stays Ready in the API and keeps its address, like a hung model server.
        """
        pod = self.pods[name]
        for p in [port] if port is not None else list(pod.sims):
            pod.sims.pop(p).stop()

    def pod_for_endpoint(self, endpoint: str | None) -> str | None:
        if endpoint is None:
            return None
        ip = endpoint.rsplit(":", 1)[0]
        return next((p.name for p in self.pods.values() if p.ip == ip), None)

    # ------------------------------------------------------------------ what the EPP holds
    def view(self) -> dict[str, Any]:
        """The EPP's /debug/datastore document."""
        return self.epp.datastore_view()

    def datastore_pods(self) -> dict[str, str]:
        """Pods the EPP holds: name -> address (names alone; `verdict()` compares with namespaces)."""
        return {p["name"]: p["address"] for p in self.view()["pods"]}

    def datastore_models(self) -> dict[str, str]:
        """Models the EPP holds: modelName -> the owning object's name."""
        return {m["modelName"]: m["name"] for m in self.view()["models"]}

    def pod_view(self, name: str) -> dict[str, Any] | None:
        """This namespace's pod `name` as the datastore view shows it (metrics and their age), or None."""
        return next(
            (p for p in self.view()["pods"] if p["namespace"] == self.namespace and p["name"] == name),
            None,
        )

    def eventually_gauges(self, name: str, timeout: float = 10.0, **gauges: Any) -> dict[str, Any]:
        """Wait until the datastore view shows, for pod `name`, the gauges given (`set_gauges` keywords).

        Routing on pinned gauges is only meaningful once a scrape carried them into the datastore.
        Returns the pod's view entry.
        """
        unknown = set(gauges) - set(_VIEW_KEYS)
        if unknown:
            raise TypeError(f"unknown gauges: {sorted(unknown)}")

        def check() -> dict[str, Any]:
            pod = self.pod_view(name)
            assert pod is not None, f"pod {name} not in the datastore"
            metrics = pod["metrics"]
            for gauge, want in gauges.items():
                got = metrics[_VIEW_KEYS[gauge]]
                if isinstance(want, (list, tuple, set, frozenset)):
                    assert sorted(got) == sorted(want), f"{name}.{gauge}: datastore has {got}, want {want}"
                else:
                    assert math.isclose(got, want), f"{name}.{gauge}: datastore has {got}, want {want}"
            return pod

        return eventually(check, timeout=timeout, message=f"gauges of {name} scraped")

    def eventually_stale(self, name: str, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until pod `name`'s metrics are older than the EPP's staleness threshold."""
        threshold = self.epp.settings.staleness_threshold

        def check() -> dict[str, Any]:
            pod = self.pod_view(name)
            assert pod is not None, f"pod {name} not in the datastore"
            age = pod["metricsAgeSeconds"]
            assert age is None or age > threshold, f"{name}: metrics {age:.2f}s old, threshold {threshold}s"
            return pod

        return eventually(check, timeout=timeout, message=f"metrics of {name} stale")

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
        """Wait until the API server stamps new objects later than `timestamp` (1 s resolution)."""

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
            return client_.route(None, headers=headers or request_headers("/v1/models", method="GET"))
        if body is None:
            payload: dict[str, Any] = {"prompt": prompt, "max_tokens": 4}
            if model is not None:
                payload["model"] = model
            return client_.route(payload, headers=headers, chunks=chunks)
        return client_.route(body, headers=headers, chunks=chunks)

    def routed_pod(self, model: str | None, **route_args: Any) -> str:
        """Route one request that must succeed; the name of the pod it went to.

        Also checks the two ways the destination is told to Envoy (metadata and header) agree.
        """
        result = self.route(model, **route_args)
        assert result.status == 200, f"{result.status}: {result.message}"
        assert result.endpoint == result.header_endpoint, result
        pod = self.pod_for_endpoint(result.endpoint)
        assert pod is not None, f"endpoint {result.endpoint} is not a pod of this test bed"
        return pod

    def route_and_respond(
        self,
        model: str,
        response_chunks: Sequence[bytes],
        *,
        content_type: str = "text/event-stream",
        status: int = 200,
        prompt: str = "hello",
    ) -> ExtProcResult:
        """One whole exchange: the request, then the model server's response headers and body chunks."""
        payload = {"model": model, "prompt": prompt, "max_tokens": 4, "stream": True}
        return self.epp.ext_proc().round_trip(
            json.dumps(payload).encode(),
            {":status": str(status), "content-type": content_type},
            response_chunks,
        )

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
        """Settle (`settled()`), then wait until the datastore agrees with the API server.

        Settling first makes this a sound step for negative checks too: a write that must change
        nothing passes only once the EPP has applied it, not merely because it had not looked yet.
        """
        self.settled(timeout=timeout)

        def check() -> Verdict:
            verdict = self.verdict()
            assert verdict.consistent, verdict.summary()
            return verdict

        return eventually(check, timeout=timeout, message="datastore consistent with the API server")

    # ------------------------------------------------------------------ the settle barrier
    def settled(self, timeout: float = 15.0, *, at: Mapping[str, str | int] | None = None) -> dict[str, Any]:
        """Wait until the EPP has applied this bed's latest write of each kind it can see, and is idle.

        `at` adds resourceVersions written some other way (kubectl), per kind plural ("pods",
        "inferencemodels", "inferencepools"). Returns the datastore view that showed the EPP
        settled. Call it before any "X did not happen" check (STYLE habit 20).
        """
        return self.settle_barrier.wait(self.epp.datastore_view, at=at, timeout=timeout)

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
