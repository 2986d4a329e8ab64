"""The pool every policy routes to: pool, models and pods in the API server, simulators on one loop.

The pods are real API objects (forged stand-in pods: `harness.cluster.forged` reports them Ready at their
loopback addresses; the node agent never runs them), so the EPP discovers them as in a cluster.
Their simulators all run on one event loop in one thread, which the load generator shares: on
CPython the GIL makes threads share one core anyway, and one loop avoids the switching delays
several threads would add to every simulated step; it also lets the oracle read every engine's true
state between two steps without locks.
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client

from harness.base.addresses import AddressPool
from harness.base.eventually import eventually
from harness.base.lifecycle import StartStop
from harness.cli.bench.policies import PoolView
from harness.cli.bench.workload import WorkloadSpec, inference_model_name
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.forged import ForgedKubelet
from harness.cluster.kube import Kube
from harness.sim import ModelServerSim, SimConfig, SimThread
from harness.sim._engine import Counters

SIM_PORT = 8000
T = TypeVar("T")


@dataclass(frozen=True)
class PoolSpec:
    pods: int
    sim: SimConfig
    pool_name: str = "bench-pool"


class BenchPool(StartStop):
    """Start: API objects, simulators, pods. ``stop()`` undoes what was started (idempotent)."""

    def __init__(self, access: ClusterAccess, namespace: str, spec: PoolSpec, workload: WorkloadSpec) -> None:
        self.access = access
        self.namespace = namespace
        self.spec = spec
        self.workload = workload
        self.sims: list[ModelServerSim] = []
        self._api: client.ApiClient | None = None
        self._addresses = AddressPool()
        self._thread: SimThread | None = None

    def _start(self) -> None:
        spec, ns = self.spec, self.namespace
        self._api = self.access.api_client()
        _ensure_namespace(self._api, ns)
        kube = Kube(self._api)
        kube.pools.create(
            ns,
            PoolBuilder(spec.pool_name)
            .namespace(ns)
            .selector({"app": spec.pool_name})
            .port(SIM_PORT)
            .extension_ref("epp")
            .build(kube.generation),
        )
        for served in self.workload.served_models:
            for criticality, _ in self.workload.criticality_mix:
                name = inference_model_name(served, criticality)
                model = ModelBuilder(name).namespace(ns).model_name(name).pool(spec.pool_name)
                for kind, body in model.criticality(criticality).target(served).objects(kube.generation):
                    kube.model_client(kind).create(ns, body)
        self.sims = [ModelServerSim(self._addresses.acquire(), SIM_PORT, spec.sim) for _ in range(spec.pods)]
        self._thread = SimThread(*self.sims).start()
        kubelet = ForgedKubelet(self._api)
        for i, sim in enumerate(self.sims):
            pod = PodBuilder(f"{spec.pool_name}-{i}").namespace(ns).labels({"app": spec.pool_name}).build()
            kubelet.start(ns, pod, sim.host)

    def stop(self) -> None:
        try:
            if self._thread is not None:
                self._thread.stop()
                self._thread = None
        finally:
            self._addresses.release_all()
            if self._api is not None:
                self._api.close()  # type: ignore[no-untyped-call]
                self._api = None

    @property
    def view(self) -> PoolView:
        return PoolView(self.sims, self.namespace, self.spec.pool_name, Path(self.access.kubeconfig_path))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the simulators' loop (the load generator, the oracle's reads)."""
        if self._thread is None:
            coro.close()
            raise RuntimeError("the pool is not started")
        return self._thread.run(coro)

    def server_ttfts(self, skip_fraction: float = 0.0) -> list[float]:
        """TTFTs as the simulators saw them (arrival to first token) since the last reset, without
        each pod's first ``skip_fraction`` of first tokens (a trace's warm-up)."""
        out: list[float] = []
        for sim in self.sims:
            ttfts = sim.call_on_loop(sim.engine.recent_ttfts)
            out += ttfts[int(len(ttfts) * skip_fraction) :]
        return out

    def served_per_pod(self) -> list[int]:
        return [sum(sim.requests_by_model.values()) for sim in self.sims]

    def counters(self) -> list[Counters]:
        """Every simulator's engine counters (late steps, first-token times, adapter loads, ...)."""
        return [sim.call_on_loop(sim.engine.counters) for sim in self.sims]

    def reset(self, time_scale: float | None = None, timeout: float = 30.0) -> None:
        """Wait until every simulator is idle, then back to a cold start (see ``ModelServerSim.reset``)."""

        def idle() -> None:
            busy = [s.address for s in self.sims if (st := s.state()).running or st.waiting]
            assert not busy, f"simulators still busy: {busy}"

        eventually(idle, timeout=timeout, message="simulators drained")
        for sim in self.sims:
            sim.reset(time_scale)


def _ensure_namespace(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
