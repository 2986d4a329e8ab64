"""API JSON of the v1 generation for unit tests: InferencePool v1, InferenceObjective,
InferenceModelRewrite (harness.builders knows only v1alpha2 so far). Shapes: reference/upstream-v1.md §a.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from harness.cluster import releases

V1 = releases.V1.pool_api_version
X_V1ALPHA2 = releases.V1ALPHA2.pool_api_version
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _meta(name: str, ns: str, age_s: int, deleting: bool, rv: str = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "resourceVersion": rv,
        "creationTimestamp": (T0 + timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-06-01T00:00:00Z"
    return meta


def pool_v1(
    name: str = "pool",
    ns: str = "ns1",
    *,
    ports: Sequence[int] = (8000,),
    selector: Mapping[str, str] | None = None,
    app_protocol: str | None = None,
    picker: Mapping[str, Any] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": dict(selector or {"app": "vllm"})},
        "targetPorts": [{"number": p} for p in ports],
    }
    if app_protocol is not None:
        spec["appProtocol"] = app_protocol
    if picker is not None:
        spec["endpointPickerRef"] = dict(picker)
    return {"apiVersion": V1, "kind": "InferencePool", "metadata": _meta(name, ns, 0, deleting), "spec": spec}


def pool_ref(name: str = "pool", group: str | None = None, kind: str | None = None) -> dict[str, str]:
    ref = {"name": name}
    if group is not None:
        ref["group"] = group
    if kind is not None:
        ref["kind"] = kind
    return ref


def objective(
    name: str,
    priority: int | None = None,
    *,
    ns: str = "ns1",
    ref: Mapping[str, str] | None = None,
    age_s: int = 0,
    deleting: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": dict(ref or pool_ref())}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": X_V1ALPHA2,
        "kind": "InferenceObjective",
        "metadata": _meta(name, ns, age_s, deleting),
        "spec": spec,
    }


def rule(*models: str, targets: Sequence[tuple[str, int | None]] = ()) -> dict[str, Any]:
    """Exact matches on `models` (none: a catch-all) with weighted targets."""
    return {
        "matches": [{"model": {"type": "Exact", "value": m}} for m in models],
        "targets": [
            {"modelRewrite": t} if w is None else {"modelRewrite": t, "weight": w} for t, w in targets
        ],
    }


def rewrite(
    name: str,
    *rules: dict[str, Any],
    ns: str = "ns1",
    ref: Mapping[str, str] | None = None,
    age_s: int = 0,
    deleting: bool = False,
) -> dict[str, Any]:
    return {
        "apiVersion": X_V1ALPHA2,
        "kind": "InferenceModelRewrite",
        "metadata": _meta(name, ns, age_s, deleting),
        "spec": {"poolRef": dict(ref or pool_ref()), "rules": list(rules)},
    }
