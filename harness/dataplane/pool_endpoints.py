"""What a gateway does with an InferencePool besides calling its EPP: keep its model servers' cluster
equal to the pool's endpoints, one per (Ready pod, target port).

A list-aware Envoy (`EnvoyOptions.follow_pool_endpoints`) only routes to hosts its cluster holds:
the EPP's comma list (the pick, then fallbacks) names them, Envoy's override_host policy takes the
first that is there and moves to the next on a refused connection; a FailOpen Envoy without its EPP
load-balances over them. `pool_endpoints` is that set, computed from the pool and its pods as the
API returns them (either generation: v1 `selector.matchLabels` and `targetPorts`, v1alpha2 a plain
selector and `targetPortNumber`); `PoolEndpointsFollower` re-reads them on a short period and hands
each change to Envoy (`Envoy.set_model_server_endpoints`), as a gateway controller watching pods does.
Polling rather than a watch: one list of pods per period is cheap at a test's scale and never
misses an event across a reconnect.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from harness.base.eventually import eventually
from harness.base.lifecycle import StartStop
from harness.cluster.kube import JsonObject, Kube
from harness.cluster.pod_status import is_ready
from harness.cluster.releases import V1

FOLLOW_PERIOD_S: Final = 0.1


def pool_selector(pool: Mapping[str, Any]) -> dict[str, str]:
    """The pool's label selector (v1 ``selector.matchLabels``; v1alpha2 ``selector`` itself)."""
    selector = (pool.get("spec") or {}).get("selector") or {}
    v1 = str(pool.get("apiVersion", "")).startswith(f"{V1.pool_group}/")
    labels = (selector.get("matchLabels") or {}) if v1 else selector
    return {str(k): str(v) for k, v in labels.items()}


def pool_target_ports(pool: Mapping[str, Any]) -> tuple[int, ...]:
    """The pool's target ports (v1 ``targetPorts[].number``; v1alpha2 ``targetPortNumber``)."""
    spec = pool.get("spec") or {}
    if "targetPorts" in spec:
        return tuple(int(p["number"]) for p in spec["targetPorts"])
    return (int(spec["targetPortNumber"]),) if "targetPortNumber" in spec else ()


def pool_app_protocol(pool: Mapping[str, Any]) -> str:
    """The pool's ``appProtocol`` (v1.4.0+; its default, and v1alpha2's only protocol, is ``http``)."""
    return str((pool.get("spec") or {}).get("appProtocol") or "http")


def pool_fails_open(pool: Mapping[str, Any]) -> bool:
    """Whether the pool's EPP reference says ``FailOpen`` (v1 ``endpointPickerRef``, v1alpha2
    ``extensionRef``; both default to ``FailClose``)."""
    spec = pool.get("spec") or {}
    ref = spec.get("endpointPickerRef") or spec.get("extensionRef") or {}
    return ref.get("failureMode") == "FailOpen"


def pool_endpoints(pool: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Every "ip:port" the pool serves: each Ready pod with an address, not being deleted, whose
    labels match the selector, times each target port; sorted, so equal sets compare equal."""
    selector = pool_selector(pool)
    ports = pool_target_ports(pool)
    endpoints: set[str] = set()
    for pod in pods:
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or metadata.get("deletionTimestamp") or not is_ready(pod):
            continue
        if any(labels.get(key) != value for key, value in selector.items()):
            continue
        endpoints.update(f"{ip}:{port}" for port in ports)
    return tuple(sorted(endpoints))


class PoolEndpointsFollower(StartStop):
    """A thread that keeps `publish` told of the pool's endpoints: read through `kube` every
    `period_s`, published when they change (and once at start, empty if the pool does not exist).

    ``with PoolEndpointsFollower(kube, "ns", "pool", envoy.set_model_server_endpoints): ...``.
    `wait_published(endpoints)` blocks until a given set has been handed over. A read that fails
    (the API server restarting) keeps the last set and tries again next period.
    """

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        pool_name: str,
        publish: Callable[[tuple[str, ...]], None],
        *,
        period_s: float = FOLLOW_PERIOD_S,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._pool_name = pool_name
        self._publish = publish
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._published: tuple[str, ...] | None = None  # guarded by _lock
        self.last_error: Exception | None = None

    @property
    def published(self) -> tuple[str, ...] | None:
        with self._lock:
            return self._published

    def _start(self) -> None:
        self._stop.clear()
        self.sync()
        self._thread = threading.Thread(
            target=self._run, name=f"pool-endpoints-{self._pool_name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def read(self) -> tuple[str, ...]:
        """The pool's endpoints now, as the API has them (none while the pool does not exist)."""
        pools = [
            p for p in self._kube.pools.list(self._namespace) if p["metadata"]["name"] == self._pool_name
        ]
        if not pools:
            return ()
        selector = pool_selector(pools[0])
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or None
        pods: list[JsonObject] = self._kube.pods.list(self._namespace, label_selector)
        return pool_endpoints(pools[0], pods)

    def sync(self) -> None:
        """Read once and publish if the set changed."""
        endpoints = self.read()
        with self._lock:
            if endpoints == self._published:
                return
            self._publish(endpoints)
            self._published = endpoints

    def wait_published(self, endpoints: Sequence[str], timeout: float = 30.0) -> None:
        """Until exactly `endpoints` have been handed to `publish`."""
        wanted = tuple(sorted(endpoints))

        def published() -> None:
            assert self.published == wanted, f"published {self.published}, want {wanted}"

        eventually(published, timeout=timeout, message="the gateway follows the pool's endpoints")

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            try:
                self.sync()
                self.last_error = None
            except Exception as exc:
                self.last_error = exc
