"""Immutable snapshots of InferencePool, InferenceModel and Pod, parsed from API-server JSON.

Parsing happens once, where objects enter the EPP (the watch cache), so reconcilers, datastore and
scheduler work with small frozen values instead of nested dicts. Only the fields the EPP acts on are
kept; the CRD schema (validated by the API server) guarantees their shape, so parsing is strict
about types but does not re-validate ranges.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

API_GROUP = "inference.networking.x-k8s.io"
API_VERSION = "v1alpha2"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class NamespacedName(NamedTuple):
    """The identity of a namespaced object; pods are keyed by this alone (never by IP or port)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class Criticality(enum.Enum):
    CRITICAL = "Critical"
    STANDARD = "Standard"
    SHEDDABLE = "Sheddable"


def parse_timestamp(value: str | None) -> datetime:
    """RFC 3339 from metadata.creationTimestamp; a missing value sorts first (the epoch)."""
    if not value:
        return _EPOCH
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ValueError("object has no metadata")
    return meta


def _key(obj: Mapping[str, Any]) -> NamespacedName:
    meta = _meta(obj)
    return NamespacedName(str(meta.get("namespace", "")), str(meta["name"]))


@dataclass(frozen=True, slots=True)
class InferencePool:
    key: NamespacedName
    selector: Mapping[str, str]
    target_port: int
    resource_version: str = ""
    deleting: bool = False

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> InferencePool:
        spec = obj.get("spec") or {}
        meta = _meta(obj)
        return cls(
            key=_key(obj),
            # Copied so the snapshot never aliases a cache dict (upstream bug #804).
            selector=dict(spec.get("selector") or {}),
            target_port=int(spec["targetPortNumber"]),
            resource_version=str(meta.get("resourceVersion", "")),
            deleting=bool(meta.get("deletionTimestamp")),
        )

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Service-style equality selector; an empty selector matches nothing, as upstream."""
        if not self.selector:
            return False
        return all(labels.get(k) == v for k, v in self.selector.items())


@dataclass(frozen=True, slots=True)
class TargetModel:
    name: str
    weight: int | None = None

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> TargetModel:
        weight = obj.get("weight")
        return cls(name=str(obj["name"]), weight=None if weight is None else int(weight))


@dataclass(frozen=True, slots=True)
class InferenceModel:
    key: NamespacedName
    model_name: str
    pool_name: str
    criticality: Criticality | None = None
    target_models: tuple[TargetModel, ...] = ()
    created: datetime = _EPOCH
    deleting: bool = False

    @property
    def claim_order(self) -> tuple[datetime, NamespacedName]:
        """Who owns a contested modelName: the smallest wins (DESIGN.md §6).

        Oldest creationTimestamp first; those have one-second resolution, so equal ones are ordered by
        namespace/name. Every path that decides ownership (an event, the pool's re-list after a
        restart, a promotion) uses this one order, so they all agree.
        """
        return (self.created, self.key)

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> InferenceModel:
        spec = obj.get("spec") or {}
        meta = _meta(obj)
        crit = spec.get("criticality")
        return cls(
            key=_key(obj),
            model_name=str(spec["modelName"]),
            pool_name=str((spec.get("poolRef") or {}).get("name", "")),
            criticality=Criticality(crit) if crit else None,
            target_models=tuple(TargetModel.from_api(t) for t in spec.get("targetModels") or ()),
            created=parse_timestamp(meta.get("creationTimestamp")),
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def is_critical(self) -> bool:
        """Only Critical counts; Standard, Sheddable and unset take the sheddable branch (v0.3.0)."""
        return self.criticality is Criticality.CRITICAL


@dataclass(frozen=True, slots=True)
class PodObject:
    """What the pod reconciler needs of a Pod: identity, labels, address, readiness, deletion."""

    key: NamespacedName
    labels: Mapping[str, str] = field(default_factory=dict)
    pod_ip: str = ""
    ready: bool = False
    deleting: bool = False

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> PodObject:
        meta = _meta(obj)
        status = obj.get("status") or {}
        ready = False
        for cond in status.get("conditions") or ():
            if cond.get("type") == "Ready":
                # The first Ready condition decides, as upstream.
                ready = cond.get("status") == "True"
                break
        return cls(
            key=_key(obj),
            labels=dict(meta.get("labels") or {}),
            pod_ip=str(status.get("podIP") or ""),
            ready=ready,
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def routable(self) -> bool:
        """Ready, addressed and not being deleted (a deleting pod is never added, upstream #713)."""
        return self.ready and bool(self.pod_ip) and not self.deleting
