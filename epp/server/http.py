"""The metrics port: Prometheus `/metrics` and the read-only datastore view `/debug/datastore`.

The debug view is the harness's consistency oracle (DESIGN.md §2, Debug snapshot): pool, models and
pods as the datastore holds them right now, with each pod's metrics and their age. GET only; both
routes only read. Pods and models are sorted by namespace/name so two dumps of the same state are
identical.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from epp.api.types import InferenceModel, InferencePool
from epp.datastore.types import PodMetrics

METRICS_PATH = "/metrics"
DEBUG_DATASTORE_PATH = "/debug/datastore"


class DatastoreView(Protocol):
    """The reads the debug view needs (the Datastore Protocol satisfies it)."""

    def pool_get(self) -> InferencePool | None: ...

    def model_get_all(self) -> Sequence[InferenceModel]: ...

    def pod_get_all(self) -> Sequence[PodMetrics]: ...


def debug_view(datastore: DatastoreView, now: float) -> dict[str, Any]:
    """The JSON document served at /debug/datastore (`now` is the clock the metrics were stamped by)."""
    pool = datastore.pool_get()
    return {
        "pool": None
        if pool is None
        else {
            "namespace": pool.key.namespace,
            "name": pool.key.name,
            "selector": dict(pool.selector),
            "targetPortNumber": pool.target_port,
        },
        "models": [
            {
                "namespace": m.key.namespace,
                "name": m.key.name,
                "modelName": m.model_name,
                "criticality": None if m.criticality is None else m.criticality.value,
                "targetModels": [{"name": t.name, "weight": t.weight} for t in m.target_models],
                "poolRef": {"name": m.pool_name},
            }
            for m in sorted(datastore.model_get_all(), key=lambda m: m.key)
        ],
        "pods": [_pod(p, now) for p in sorted(datastore.pod_get_all(), key=lambda p: p.pod.key)],
    }


def _pod(pod: PodMetrics, now: float) -> dict[str, Any]:
    m = pod.metrics
    return {
        "namespace": pod.pod.key.namespace,
        "name": pod.pod.key.name,
        "address": pod.pod.address,
        "metrics": {
            "waitingQueueSize": m.waiting_queue_size,
            "runningQueueSize": m.running_queue_size,
            "kvCacheUsagePercent": m.kv_cache_usage,
            "activeModels": sorted(m.active_models),
            "waitingModels": sorted(m.waiting_models),
            "maxActiveModels": m.max_active_models,
        },
        "metricsAgeSeconds": None if m.updated_at is None else max(0.0, now - m.updated_at),
        # Requests this EPP routed to the pod whose responses have not ended yet.
        "inFlight": pod.dispatched.count,
    }


def metrics_app(
    registry: CollectorRegistry, datastore: DatastoreView, clock: Callable[[], float]
) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def debug(_: web.Request) -> web.Response:
        return web.json_response(debug_view(datastore, clock()))

    app = web.Application()
    app.router.add_get(METRICS_PATH, metrics, allow_head=False)
    app.router.add_get(DEBUG_DATASTORE_PATH, debug, allow_head=False)
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound now, so the caller knows the port (0 → ephemeral) before serving."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)
