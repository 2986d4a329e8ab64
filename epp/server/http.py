"""The HTTP listeners: Prometheus `/metrics`, and the read-only datastore view `/debug/datastore`.

They are separate listeners because they face different readers: /metrics binds `--bindAddress` so
Prometheus can scrape it from other pods, while the debug view, which dumps every pod address and
model unauthenticated, binds 127.0.0.1 unless `--debugBindAddress` says otherwise (DESIGN.md §6).

The debug view is the harness's consistency oracle (DESIGN.md §2, Debug snapshot): pool, models and
pods as the datastore holds them right now, with each pod's metrics and their age. GET only; both
routes only read. Pods and models are sorted by namespace/name so two dumps of the same state are
identical.

It also carries `watches`, the settle barrier's input (DESIGN.md §3): per watched resource, what the
watch covers (namespace, selectors) and how far the EPP has got — the newest resourceVersion
received, the newest applied (received and reconciled), and the work still queued, in flight or
waiting to be retried. The whole document is built in one synchronous call on the EPP's event loop,
so the datastore and the progress it shows are one consistent moment.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from epp.api.types import InferenceModel, InferencePool
from epp.datastore.types import PodMetrics
from epp.k8s.controllers import WatchProgress

METRICS_PATH = "/metrics"
DEBUG_DATASTORE_PATH = "/debug/datastore"


class DatastoreView(Protocol):
    """The reads the debug view needs (the Datastore Protocol satisfies it)."""

    def pool_get(self) -> InferencePool | None: ...

    def model_get_all(self) -> Sequence[InferenceModel]: ...

    def pod_get_all(self) -> Sequence[PodMetrics]: ...


WatchProgressSource = Callable[[], Sequence[WatchProgress]]


def no_watches() -> Sequence[WatchProgress]:
    return ()


def debug_view(datastore: DatastoreView, now: float, watches: Sequence[WatchProgress] = ()) -> dict[str, Any]:
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
        "watches": {w.resource: _watch(w) for w in watches},
    }


def _watch(w: WatchProgress) -> dict[str, Any]:
    return {
        "namespace": w.namespace,
        "fieldSelector": w.field_selector,
        "labelSelector": w.label_selector,
        "receivedResourceVersion": w.received_resource_version,
        "appliedResourceVersion": w.applied_resource_version,
        "queued": w.queued,
        "processing": w.processing,
        "retrying": w.retrying,
        "idle": w.idle,
        "relists": w.relists,
        "stalledWatches": w.stalled_watches,
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


def metrics_app(registry: CollectorRegistry) -> web.Application:
    """/metrics, for the metrics listener (reachable by Prometheus: `--bindAddress`)."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get(METRICS_PATH, metrics, allow_head=False)
    return app


def debug_app(
    datastore: DatastoreView, clock: Callable[[], float], watches: WatchProgressSource = no_watches
) -> web.Application:
    """/debug/datastore, for its own listener (loopback by default: `--debugBindAddress`)."""

    async def debug(_: web.Request) -> web.Response:
        return web.json_response(debug_view(datastore, clock(), watches()))

    app = web.Application()
    app.router.add_get(DEBUG_DATASTORE_PATH, debug, allow_head=False)
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound now, so the caller knows the port (0 → ephemeral) before serving."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)
