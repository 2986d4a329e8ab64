"""One namespace's worth of cluster, the EPP under test in this process, and what it is checked against.

``TestBed`` = a cluster part (``harness.beds.cluster.Cluster``: pools, models and pods through the real
API server, pods run by the node agent) + an observation part (``harness.verdicts.observer.EppObserver``: the
EPP's debug view, the consistency oracle, the settle barrier) + the EPP itself, in-process
(``harness.subject.epp_inprocess.EppInProcess``), with requests routed over ext_proc. The integration suite
and ``harness replay`` drive the same methods, so a scenario written in YAML and one written in
Python mean the same thing. ``harness.beds.stack.Stack`` composes the same two parts around the EPP
process, Envoy in front.

Nothing here touches the EPP's datastore: state goes in through the API server and the simulators'
admin ports, and comes out through ext_proc, health, /metrics and /debug/datastore.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from epp.config import DEFAULT_WATCH_BOOKMARK_INTERVAL
from epp.k8s.controllers import Reconcilers
from harness.beds.cluster import DEFAULT_POOL, DEFAULT_PORT, Cluster, ClusterPod
from harness.cluster.releases import V1
from harness.dataplane.extproc_client import ExtProcResult, request_headers
from harness.sim import SimAdmin, SimConfig
from harness.subject.epp_inprocess import EppInProcess, EppSettings
from harness.verdicts.observer import EppObserver
from harness.verdicts.oracle import Verdict
from harness.verdicts.settle import SettleBarrier

__all__ = ["DEFAULT_POOL", "DEFAULT_PORT", "ClusterPod", "TestBed"]


class TestBed:
    """Drives one namespace; ``close()`` stops the EPP and deletes the pods it made."""

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
        """``reconcilers``: build the EPP with these instead of the production ones (see EppInProcess).
        ``watch_bookmark_interval``: the EPP's watch liveness interval (fault tests shorten it)."""
        self.namespace = namespace
        self.pool_name = pool_name
        self.settle_barrier = SettleBarrier()
        self.cluster = Cluster(
            api_client, namespace, barrier=self.settle_barrier, pool_name=pool_name, sim_config=sim_config
        )
        self.kube = self.cluster.kube
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
        self.observer = EppObserver(
            self.kube, namespace, pool_name, self.settle_barrier, self.epp.datastore_view
        )

    @property
    def pods(self) -> dict[str, ClusterPod]:
        return self.cluster.pods

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
            self.cluster.close()

    def __enter__(self) -> TestBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the cluster part
    def apply_pool(
        self,
        selector: Mapping[str, str] | None = None,
        port: int | Sequence[int] = DEFAULT_PORT,
        name: str | None = None,
    ) -> dict[str, Any]:
        return self.cluster.apply_pool(selector, port, name)

    def delete_pool(self, name: str | None = None) -> None:
        self.cluster.delete_pool(name)

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
        return self.cluster.apply_model(
            name, model_name, criticality=criticality, targets=targets, pool=pool, namespace=namespace
        )

    def delete_model(self, name: str, namespace: str | None = None) -> None:
        self.cluster.delete_model(name, namespace)

    def add_pod(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        *,
        ready: bool = True,
        sim_config: SimConfig | None = None,
        ports: Sequence[int] | None = None,
        pre_stop: int | None = None,
    ) -> ClusterPod:
        """A pod the node agent runs (see ``Cluster.add_pod``)."""
        return self.cluster.add_pod(
            name, labels, ready=ready, sim_config=sim_config, ports=ports, pre_stop=pre_stop
        )

    def pod_ready(self, name: str) -> None:
        self.cluster.pod_ready(name)

    def pod_unready(self, name: str) -> None:
        self.cluster.pod_unready(name)

    def pod_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        self.cluster.pod_labels(name, labels)

    def terminate_pod(self, name: str) -> dict[str, Any]:
        return self.cluster.terminate_pod(name)

    def delete_pod(self, name: str) -> None:
        self.cluster.delete_pod(name)

    def force_delete_pod(self, name: str) -> None:
        self.cluster.force_delete_pod(name)

    def pod_recreate(self, name: str) -> str:
        return self.cluster.pod_recreate(name)

    def kill_container(self, name: str, port: int | None = None) -> int:
        return self.cluster.kill_container(name, port)

    def set_gauges(self, name: str, *, port: int | None = None, **gauges: Any) -> None:
        self.cluster.set_gauges(name, port=port, **gauges)

    def pod_stop_serving(self, name: str, port: int | None = None) -> None:
        self.cluster.pod_stop_serving(name, port)

    def sim(self, name: str, port: int | None = None) -> SimAdmin:
        return self.cluster.sim(name, port)

    def pod_for_endpoint(self, endpoint: str | None) -> str | None:
        return self.cluster.pod_for_endpoint(endpoint)

    def create_namespace(self, suffix: str) -> str:
        return self.cluster.create_namespace(suffix)

    def server_time(self) -> str:
        return self.cluster.server_time()

    def eventually_server_time_after(self, timestamp: str, timeout: float = 5.0) -> str:
        return self.cluster.eventually_server_time_after(timestamp, timeout)

    # forged pods (never run by the agent): for states no kubelet produces
    def add_forged_pod(
        self, name: str, labels: Mapping[str, str] | None = None, *, ready: bool = True
    ) -> ClusterPod:
        return self.cluster.add_forged_pod(name, labels, ready=ready)

    def forged_move(self, name: str) -> str:
        return self.cluster.forged_move(name)

    def forged_ready(self, name: str) -> None:
        self.cluster.forged_ready(name)

    def forged_unready(self, name: str) -> None:
        self.cluster.forged_unready(name)

    def forged_server_dies(self, name: str) -> None:
        self.cluster.forged_server_dies(name)

    def forged_hold_and_delete(self, name: str) -> None:
        self.cluster.forged_hold_and_delete(name)

    def forged_release(self, name: str) -> None:
        self.cluster.forged_release(name)

    # ------------------------------------------------------------------ the observation part
    def view(self) -> dict[str, Any]:
        return self.observer.view()

    def datastore_pods(self) -> dict[str, str]:
        return self.observer.datastore_pods()

    def datastore_models(self) -> dict[str, str]:
        return self.observer.datastore_models()

    def pod_view(self, name: str) -> dict[str, Any] | None:
        return self.observer.pod_view(name)

    def eventually_gauges(self, name: str, timeout: float = 10.0, **gauges: Any) -> dict[str, Any]:
        return self.observer.eventually_gauges(name, timeout, **gauges)

    def eventually_scraped(self, timeout: float = 10.0) -> dict[str, Any]:
        return self.observer.eventually_scraped(timeout)

    def eventually_stale(self, name: str, timeout: float = 10.0) -> dict[str, Any]:
        return self.observer.eventually_stale(name, self.epp.settings.staleness_threshold, timeout)

    def verdict(self) -> Verdict:
        return self.observer.verdict()

    def eventually_consistent(self, timeout: float = 15.0) -> Verdict:
        return self.observer.eventually_consistent(timeout)

    def settled(self, timeout: float = 15.0, *, at: Mapping[str, str | int] | None = None) -> dict[str, Any]:
        return self.observer.settled(timeout, at=at)

    # ------------------------------------------------------------------ requests, over ext_proc
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
        objective = self.cluster.objective_headers(model)
        if objective:
            headers = {**(headers or request_headers()), **objective}
        if bodyless:
            return client_.route(None, headers=headers or request_headers("/v1/models", method="GET"))
        if body is None:
            payload: dict[str, Any] = {"prompt": prompt, "max_tokens": 4}
            if model is not None:
                payload["model"] = model
            return client_.route(payload, headers=headers, chunks=chunks)
        return client_.route(body, headers=headers, chunks=chunks)

    def assert_not_declared(self, model: str) -> None:
        """No object of the pool declares ``model`` any more, and the EPP acts on that: a v1alpha2
        pool serves declared models only (404); a v1 pool passes any model through as named, so the
        request is routed with its body untouched (no rewrite, no objective applied)."""
        result = self.route(model)
        if self.cluster.generation is V1:
            assert result.status == 200, (
                f"an undeclared model routes as named in v1: {result.status} {result.message}"
            )
            assert result.body is None, f"an undeclared model must not be rewritten: {result.body!r}"
        else:
            assert result.status == 404, f"an undeclared model is unroutable in v1alpha2: {result.status}"

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
