"""The v0.3.0 generation (`V1ALPHA2_GROUP`/`V1ALPHA2_VERSION`) into the one shape of `epp.api.types`.

InferencePool: `spec.selector` is a plain map, `spec.targetPortNumber` the one target port. Such a
pool serves only the models its InferenceModels declare (`declared_models_only`: an unknown model
is 404, epp-behaviour.md §6).

InferenceModel becomes a `ModelRewrite` with one rule: an exact match on `modelName`, its
`targetModels` as the weighted targets (none: the model passes unchanged), and the objective its
`criticality` implies. v0.3.0 routes only `Critical` as critical; `Standard`, `Sheddable` and unset
take the sheddable branch (epp-behaviour.md §5.3), so in priorities: Critical 1, Standard and unset
-1, Sheddable -2. Oldest-wins on a contested modelName is the rewrite precedence (oldest object
first among exact matches). `poolRef.group` is kept (the CRD defaults it to this generation's
group): v0.3.0 ignored it (epp-behaviour.md §1), which is upstream #1275's bug: the models of a
same-named pool in the other group applied to this one. `kind` is ignored, as in v0.3.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.api.types import (
    V1ALPHA2_GROUP,
    V1ALPHA2_VERSION,
    Criticality,
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

GROUP = V1ALPHA2_GROUP
VERSION = V1ALPHA2_VERSION
POOLS = "inferencepools"
MODELS = "inferencemodels"

CRITICALITY_PRIORITY: Mapping[Criticality | None, int] = {
    Criticality.CRITICAL: 1,
    Criticality.STANDARD: -1,
    None: -1,
    Criticality.SHEDDABLE: -2,
}


def pool_from_api(obj: Mapping[str, Any]) -> InferencePool:
    spec = obj.get("spec") or {}
    meta = meta_of(obj)
    return InferencePool(
        key=key_of(obj),
        # Copied so the snapshot never aliases a cache dict (upstream bug #804).
        selector=dict(spec.get("selector") or {}),
        target_ports=(int(spec["targetPortNumber"]),),
        group=GROUP,
        declared_models_only=True,
        resource_version=str(meta.get("resourceVersion", "")),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def model_from_api(obj: Mapping[str, Any]) -> ModelRewrite:
    """An InferenceModel as the rewrite (and implied objective) it means."""
    spec = obj.get("spec") or {}
    meta = meta_of(obj)
    key = key_of(obj)
    declared = spec.get("criticality")
    criticality = Criticality(declared) if declared else None
    ref = spec.get("poolRef") or {}
    pool_ref = PoolRef(str(ref.get("group") or GROUP), str(ref.get("name", "")))
    created = parse_timestamp(meta.get("creationTimestamp"))
    deleting = bool(meta.get("deletionTimestamp"))
    targets = tuple(_target(t) for t in spec.get("targetModels") or ())
    return ModelRewrite(
        key=key,
        pool_ref=pool_ref,
        rules=(RewriteRule(models=(str(spec["modelName"]),), targets=targets),),
        created=created,
        deleting=deleting,
        objective=Objective(
            key=key,
            pool_ref=pool_ref,
            priority=CRITICALITY_PRIORITY[criticality],
            created=created,
            deleting=deleting,
            criticality=criticality,
        ),
    )


def _target(obj: Mapping[str, Any]) -> TargetModel:
    weight = obj.get("weight")
    return TargetModel(name=str(obj["name"]), weight=None if weight is None else int(weight))
