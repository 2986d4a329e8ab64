"""Typed views of the API objects the EPP reads, and the read-only lookup the reconcilers use.

The EPP never writes to the API server, so these are immutable snapshots parsed from API JSON; both
API generations convert into one shape (`types`) here (`v1`, `v1alpha2`, `generation`), and nothing
else in `epp` touches raw dicts from the server.
"""

from epp.api.reader import ObjectReader, PodReader
from epp.api.types import (
    DEFAULT_POOL_GROUP,
    V1_GROUP,
    V1ALPHA2_GROUP,
    Criticality,
    EndpointKey,
    InferencePool,
    ModelRewrite,
    NamespacedName,
    Objective,
    PodObject,
    PoolRef,
    RewriteMatch,
    RewriteRule,
    TargetModel,
)

__all__ = [
    "DEFAULT_POOL_GROUP",
    "V1ALPHA2_GROUP",
    "V1_GROUP",
    "Criticality",
    "EndpointKey",
    "InferencePool",
    "ModelRewrite",
    "NamespacedName",
    "ObjectReader",
    "Objective",
    "PodObject",
    "PodReader",
    "PoolRef",
    "RewriteMatch",
    "RewriteRule",
    "TargetModel",
]
