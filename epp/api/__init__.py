"""Typed views of the API objects the EPP reads, and the read-only lookup the reconcilers use.

The EPP never writes to the API server, so these are immutable snapshots parsed from API JSON;
nothing else in `epp` touches raw dicts from the server.
"""

from epp.api.reader import ObjectReader
from epp.api.types import (
    API_GROUP,
    API_VERSION,
    Criticality,
    InferenceModel,
    InferencePool,
    NamespacedName,
    PodObject,
    TargetModel,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "Criticality",
    "InferenceModel",
    "InferencePool",
    "NamespacedName",
    "ObjectReader",
    "PodObject",
    "TargetModel",
]
