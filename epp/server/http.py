"""The HTTP listeners: Prometheus `/metrics`, and the read-only datastore view `/debug/datastore`.

They are separate listeners because they face different readers: /metrics binds `--bindAddress` so
Prometheus can scrape it from other pods, while the debug view, which dumps every pod address and
model unauthenticated, binds 127.0.0.1 unless `--debugBindAddress` says otherwise (DESIGN.md §6).

The debug view is the harness's consistency oracle (DESIGN.md §2, Debug snapshot): pool, models and
pods as the datastore holds them right now, with each pod's metrics and their age. GET only; both
routes only read. Pods and models are sorted by namespace/name so two dumps of the same state are
identical. Its v1alpha2 keys stay as they were; the one datastore shape adds:
- `pool`: `group`, `targetPorts`, `appProtocol`, `endpointPickerRef` (`targetPortNumber` is the
  first target port);
- `pods`: one entry per endpoint (pod and target port) with its `port` and `rank`;
- `models`: every model an exact rewrite rule names, with the object that wins it (for v1alpha2,
  the owning InferenceModel, as before: `criticality` is the declared one);
- `objectives` and `rewrites`: every one stored, as converted.

It also carries `watches`, the settle barrier's input (DESIGN.md §3): per watched resource, what the
watch covers (namespace, selectors) and how far the EPP has got — the newest resourceVersion
received, the newest applied (received and reconciled), and the work still queued, in flight or
waiting to be retried. The whole document is built in one synchronous call on the EPP's event loop,
so the datastore and the progress it shows are one consistent moment.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from epp.api.types import InferencePool, ModelRewrite, Objective, RewriteMatch, RewriteRule
from epp.datastore.types import PodMetrics
from epp.k8s.controllers import WatchProgress

METRICS_PATH = "/metrics"
DEBUG_DATASTORE_PATH = "/debug/datastore"


class DatastoreView(Protocol):
    """The reads the debug view needs (the Datastore Protocol satisfies it)."""

    def pool_get(self) -> InferencePool | None: ...

    def objective_get_all(self) -> Sequence[Objective]: ...

    def rewrite_get_all(self) -> Sequence[ModelRewrite]: ...

    def rewrite_get_exact(self) -> Mapping[str, RewriteMatch]: ...

    def pod_get_all(self) -> Sequence[PodMetrics]: ...


WatchProgressSource = Callable[[], Sequence[WatchProgress]]


def no_watches() -> Sequence[WatchProgress]:
    return ()


def debug_view(datastore: DatastoreView, now: float, watches: Sequence[WatchProgress] = ()) -> dict[str, Any]:
    """The JSON document served at /debug/datastore (`now` is the clock the metrics were stamped by)."""
    pool = datastore.pool_get()
    exact = sorted(datastore.rewrite_get_exact().items(), key=lambda item: (item[1].rewrite.key, item[0]))
    return {
        "pool": None if pool is None else _pool(pool),
        "models": [_model(name, match) for name, match in exact],
        "pods": [_pod(p, now) for p in sorted(datastore.pod_get_all(), key=lambda p: p.pod.key)],
        "objectives": [_objective(o) for o in sorted(datastore.objective_get_all(), key=lambda o: o.key)],
        "rewrites": [_rewrite(r) for r in sorted(datastore.rewrite_get_all(), key=lambda r: r.key)],
        "watches": {w.resource: _watch(w) for w in watches},
    }


def _pool(pool: InferencePool) -> dict[str, Any]:
    picker = pool.endpoint_picker
    return {
        "namespace": pool.key.namespace,
        "name": pool.key.name,
        "selector": dict(pool.selector),
        "targetPortNumber": pool.target_port,
        "group": pool.group,
        "targetPorts": list(pool.target_ports),
        "appProtocol": pool.app_protocol,
        "endpointPickerRef": None
        if picker is None
        else {
            "group": picker.group,
            "kind": picker.kind,
            "name": picker.name,
            "port": picker.port,
            "failureMode": picker.failure_mode,
        },
    }


def _model(name: str, match: RewriteMatch) -> dict[str, Any]:
    rewrite = match.rewrite
    implied = rewrite.objective
    criticality = None if implied is None or implied.criticality is None else implied.criticality.value
    return {
        "namespace": rewrite.key.namespace,
        "name": rewrite.key.name,
        "modelName": name,
        "criticality": criticality,
        "targetModels": _targets(match.rule),
        "poolRef": {"name": rewrite.pool_ref.name},
    }


def _targets(rule: RewriteRule) -> list[dict[str, Any]]:
    return [{"name": t.name, "weight": t.weight} for t in rule.targets]


def _objective(o: Objective) -> dict[str, Any]:
    return {
        "namespace": o.key.namespace,
        "name": o.key.name,
        "priority": o.priority,
        "effectivePriority": o.effective_priority,
        "sheddable": o.sheddable,
        "poolRef": _pool_ref(o.pool_ref.group, o.pool_ref.kind, o.pool_ref.name),
    }


def _rewrite(r: ModelRewrite) -> dict[str, Any]:
    return {
        "namespace": r.key.namespace,
        "name": r.key.name,
        "created": r.created.isoformat(),
        "poolRef": _pool_ref(r.pool_ref.group, r.pool_ref.kind, r.pool_ref.name),
        "rules": [{"models": list(rule.models), "targets": _targets(rule)} for rule in r.rules],
        "impliedPriority": None if r.objective is None else r.objective.effective_priority,
    }


def _pool_ref(group: str, kind: str, name: str) -> dict[str, str]:
    return {"group": group, "kind": kind, "name": name}


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
        "optional": w.optional,
        "available": w.available,
    }


def _pod(pod: PodMetrics, now: float) -> dict[str, Any]:
    m = pod.metrics
    return {
        "namespace": pod.pod.key.namespace,
        "name": pod.pod.key.name,
        "address": pod.pod.address,
        "port": pod.pod.port,
        "rank": pod.pod.key.rank,
        "metrics": {
            "waitingQueueSize": m.waiting_queue_size,
            "runningQueueSize": m.running_queue_size,
            "kvCacheUsagePercent": m.kv_cache_usage,
            "activeModels": sorted(m.active_models),
            "waitingModels": sorted(m.waiting_models),
            "maxActiveModels": m.max_active_models,
        },
        "metricsAgeSeconds": None if m.updated_at is None else max(0.0, now - m.updated_at),
        # Requests this EPP routed to the pod whose responses have not ended yet, their prompt tokens
        # (estimated), and those of them no response byte has come back for yet.
        "inFlight": pod.dispatched.count,
        "promptTokensInFlight": pod.dispatched.prompt_tokens,
        "prefillTokens": pod.dispatched.prefill_tokens,
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
