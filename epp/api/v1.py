"""InferencePool v1 (`V1_GROUP`/`V1_VERSION`), with the optional InferenceObjective and
InferenceModelRewrite of the experimental group (`V1ALPHA2_GROUP`/`V1ALPHA2_VERSION`), into the one
shape of `epp.api.types`.

Facts: reference/upstream-v1.md §a. A pool has `spec.selector.matchLabels`, 1 to 8
`spec.targetPorts[].number` (one endpoint per pod and port), `spec.appProtocol` (`http` by
default, or `kubernetes.io/h2c`) and `spec.endpointPickerRef` (kept for information only). Any
model may be requested: a model no rewrite matches passes unchanged.

A `poolRef` names group (default `V1_GROUP`), kind (default `InferencePool`)
and name; all three must match the pool served (upstream #1275 bound by name alone). An
InferenceModelRewrite rule matches the models of its `Exact` matches, or every model when
`matches` is empty; a rule whose matches are all of a type this EPP does not know matches nothing
(never everything).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.api.types import (
    APP_PROTOCOL_HTTP,
    POOL_KIND,
    V1_GROUP,
    V1_VERSION,
    V1ALPHA2_GROUP,
    V1ALPHA2_VERSION,
    EndpointPickerRef,
    InferencePool,
    ModelRewrite,
    Objective,
    PoolRef,
    RewriteRule,
    TargetModel,
    key_of,
    meta_of,
    parse_timestamp,
)

GROUP = V1_GROUP
VERSION = V1_VERSION
POOLS = "inferencepools"
# The optional kinds live in the experimental group.
OPTIONAL_GROUP = V1ALPHA2_GROUP
OPTIONAL_VERSION = V1ALPHA2_VERSION
OBJECTIVES = "inferenceobjectives"
REWRITES = "inferencemodelrewrites"
EXACT = "Exact"


def pool_from_api(obj: Mapping[str, Any]) -> InferencePool:
    spec = obj.get("spec") or {}
    meta = meta_of(obj)
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    ports = tuple(int(p["number"]) for p in spec.get("targetPorts") or ())
    if not ports:
        raise ValueError("spec.targetPorts is empty")
    return InferencePool(
        key=key_of(obj),
        selector={str(k): str(v) for k, v in selector.items()},
        target_ports=ports,
        group=GROUP,
        app_protocol=str(spec.get("appProtocol") or APP_PROTOCOL_HTTP),
        endpoint_picker=_picker(spec.get("endpointPickerRef")),
        resource_version=str(meta.get("resourceVersion", "")),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def objective_from_api(obj: Mapping[str, Any]) -> Objective:
    spec = obj.get("spec") or {}
    meta = meta_of(obj)
    priority = spec.get("priority")
    return Objective(
        key=key_of(obj),
        pool_ref=pool_ref(spec.get("poolRef")),
        priority=None if priority is None else int(priority),
        created=parse_timestamp(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def rewrite_from_api(obj: Mapping[str, Any]) -> ModelRewrite:
    spec = obj.get("spec") or {}
    meta = meta_of(obj)
    rules = [r for r in (_rule(raw) for raw in spec.get("rules") or ()) if r is not None]
    return ModelRewrite(
        key=key_of(obj),
        pool_ref=pool_ref(spec.get("poolRef")),
        rules=tuple(rules),
        created=parse_timestamp(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def pool_ref(raw: Mapping[str, Any] | None) -> PoolRef:
    """The CRD defaults applied here too, so an object read without them binds the same way."""
    raw = raw or {}
    return PoolRef(
        group=str(raw.get("group") or GROUP),
        name=str(raw.get("name", "")),
        kind=str(raw.get("kind") or POOL_KIND),
    )


def _rule(raw: Mapping[str, Any]) -> RewriteRule | None:
    matches = raw.get("matches") or ()
    models = tuple(
        str(m["model"]["value"])
        for m in matches
        if isinstance(m.get("model"), Mapping) and (m["model"].get("type") or EXACT) == EXACT
    )
    if matches and not models:
        return None  # only matches of unknown types: this rule matches nothing
    targets = tuple(
        TargetModel(str(t["modelRewrite"]), None if t.get("weight") is None else int(t["weight"]))
        for t in raw.get("targets") or ()
    )
    return RewriteRule(models=models, targets=targets)


def _picker(raw: Mapping[str, Any] | None) -> EndpointPickerRef | None:
    if not raw:
        return None
    port = (raw.get("port") or {}).get("number")
    return EndpointPickerRef(
        name=str(raw.get("name", "")),
        group=str(raw.get("group") or ""),
        kind=str(raw.get("kind") or "Service"),
        port=None if port is None else int(port),
        failure_mode=str(raw.get("failureMode") or "FailClose"),
    )
