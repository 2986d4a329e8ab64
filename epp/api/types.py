"""The one shape of what the EPP serves, whichever API generation it came from.

Both generations (DESIGN.md §1) are converted into these frozen values where objects enter the EPP
(the watch cache): `epp.api.v1` for `inference.networking.k8s.io` (InferencePool v1, with the
optional InferenceObjective and InferenceModelRewrite), `epp.api.v1alpha2` for
`inference.networking.x-k8s.io` (InferencePool and InferenceModel as in v0.3.0). Reconcilers,
datastore, scheduler and handlers see only this module's types and never branch on the generation:

- `InferencePool`: selector, target ports (one endpoint per pod and port), app protocol;
- `Objective`: a priority (unset 0, negative = sheddable);
- `ModelRewrite`: rules matching the body's `model` (exactly, or any model when a rule has no
  match), each with weighted target models;
- `PodObject`: what the pod reconciler needs of a Pod; an endpoint of the pool is (pod, port).

Only the fields the EPP acts on are kept; the CRD schema (validated by the API server) guarantees
their shape, so parsing is strict about types but does not re-validate ranges.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

# The two API generations' groups and versions, spelled here only (epp.api.v1, epp.api.v1alpha2 and
# epp.api.generation take them from here).
V1_GROUP = "inference.networking.k8s.io"
V1_VERSION = "v1"
V1ALPHA2_GROUP = "inference.networking.x-k8s.io"
V1ALPHA2_VERSION = "v1alpha2"
POOL_GROUPS = (V1_GROUP, V1ALPHA2_GROUP)
POOL_KIND = "InferencePool"

# The generation the EPP serves when nothing says otherwise: v1, as upstream v1.x (the harness and
# the chart pass `--pool-group` for the generation they install).
DEFAULT_POOL_GROUP = V1_GROUP

# InferencePool v1 `spec.appProtocol`: how the gateway talks to the model servers.
APP_PROTOCOL_HTTP = "http"
APP_PROTOCOL_H2C = "kubernetes.io/h2c"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class NamespacedName(NamedTuple):
    """The identity of a namespaced object; pods are keyed by this alone (never by IP or port)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class EndpointKey(NamedTuple):
    """One endpoint of the pool: a pod and the index of one of the pool's target ports (its rank).

    Keyed by rank, not port number, so a port renumbered in place keeps the endpoint (and its
    metrics), as a v1alpha2 `targetPortNumber` change always did; the port itself is on `Pod`.
    """

    namespace: str
    name: str  # the pod's name
    rank: int = 0

    @property
    def pod(self) -> NamespacedName:
        return NamespacedName(self.namespace, self.name)

    def __str__(self) -> str:
        base = f"{self.namespace}/{self.name}"
        return base if self.rank == 0 else f"{base}#{self.rank}"


def endpoint_key(pod: NamespacedName, rank: int = 0) -> EndpointKey:
    return EndpointKey(pod.namespace, pod.name, rank)


class Criticality(enum.Enum):
    CRITICAL = "Critical"
    STANDARD = "Standard"
    SHEDDABLE = "Sheddable"


def parse_timestamp(value: str | None) -> datetime:
    """RFC 3339 from metadata.creationTimestamp; a missing value sorts first (the epoch)."""
    if not value:
        return _EPOCH
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ValueError("object has no metadata")
    return meta


def key_of(obj: Mapping[str, Any]) -> NamespacedName:
    meta = meta_of(obj)
    return NamespacedName(str(meta.get("namespace", "")), str(meta["name"]))


@dataclass(frozen=True, slots=True)
class PoolRef:
    """What an objective or rewrite binds to: group, kind and name (upstream #1275 forgot the group)."""

    group: str
    name: str
    kind: str = POOL_KIND


@dataclass(frozen=True, slots=True)
class EndpointPickerRef:
    """InferencePool v1 `spec.endpointPickerRef` (v0.3.0 `extensionRef`): read for information only."""

    name: str
    group: str = ""
    kind: str = "Service"
    port: int | None = None
    failure_mode: str = "FailClose"


@dataclass(frozen=True, slots=True)
class InferencePool:
    key: NamespacedName
    selector: Mapping[str, str]
    # One endpoint per pod and port (data-parallel ranks), each probed and scored on its own port.
    target_ports: tuple[int, ...]
    group: str = V1_GROUP
    app_protocol: str = APP_PROTOCOL_HTTP
    endpoint_picker: EndpointPickerRef | None = None
    # A model no rewrite rule matches is refused (404) instead of passed on unchanged: what a
    # generation whose objects declare every model means (v1alpha2's InferenceModel).
    declared_models_only: bool = False
    resource_version: str = ""
    deleting: bool = False

    @property
    def target_port(self) -> int:
        """The first target port (the only one of a v1alpha2 pool)."""
        return self.target_ports[0]

    def binds(self, ref: PoolRef) -> bool:
        """Whether an object in the pool's namespace with this poolRef belongs to this pool."""
        return ref == PoolRef(self.group, self.key.name)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Service-style equality selector; an empty selector matches nothing, as upstream."""
        if not self.selector:
            return False
        return all(labels.get(k) == v for k, v in self.selector.items())


@dataclass(frozen=True, slots=True)
class Objective:
    """What a request is worth: `priority` unset counts as 0; below 0 it is sheddable (429 when
    saturated); higher is served first wherever requests wait."""

    key: NamespacedName
    pool_ref: PoolRef
    priority: int | None = None
    created: datetime = _EPOCH
    deleting: bool = False
    # v1alpha2 only: the InferenceModel's criticality as declared, for the debug view. No decision
    # reads it: `priority` says everything (converted in epp.api.v1alpha2).
    criticality: Criticality | None = None

    @property
    def effective_priority(self) -> int:
        return 0 if self.priority is None else self.priority

    @property
    def sheddable(self) -> bool:
        return self.effective_priority < 0


DEFAULT_OBJECTIVE_PRIORITY = 0


@dataclass(frozen=True, slots=True)
class TargetModel:
    name: str
    weight: int | None = None


@dataclass(frozen=True, slots=True)
class RewriteRule:
    """`models`: the names it matches exactly; empty = every model (a catch-all).

    `targets` empty means "keep the requested model" (a v1alpha2 InferenceModel without
    targetModels); v1 rules always have at least one.
    """

    models: tuple[str, ...] = ()
    targets: tuple[TargetModel, ...] = ()

    @property
    def catch_all(self) -> bool:
        return not self.models


@dataclass(frozen=True, slots=True)
class ModelRewrite:
    key: NamespacedName
    pool_ref: PoolRef
    rules: tuple[RewriteRule, ...] = ()
    created: datetime = _EPOCH
    deleting: bool = False
    # The objective a match implies when the request names none: a v1alpha2 InferenceModel's
    # criticality. v1 rewrites carry none (the objective comes from the request's header).
    objective: Objective | None = None

    @property
    def claim_order(self) -> tuple[datetime, NamespacedName]:
        """Who wins between two objects matching alike: the smallest (DESIGN.md §6).

        Oldest creationTimestamp first; those have one-second resolution, so equal ones are ordered by
        namespace/name. Every path that decides (an event, the pool's re-list after a restart, the
        removal of a winner) uses this one order, so they all agree.
        """
        return (self.created, self.key)


@dataclass(frozen=True, slots=True)
class RewriteMatch:
    """The rule that decides a model: which object, which of its rules, and whether it matched by name."""

    rewrite: ModelRewrite
    rule: RewriteRule
    exact: bool


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
        meta = meta_of(obj)
        status = obj.get("status") or {}
        ready = False
        for cond in status.get("conditions") or ():
            if cond.get("type") == "Ready":
                # The first Ready condition decides, as upstream.
                ready = cond.get("status") == "True"
                break
        return cls(
            key=key_of(obj),
            labels=dict(meta.get("labels") or {}),
            pod_ip=str(status.get("podIP") or ""),
            ready=ready,
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def routable(self) -> bool:
        """Ready, addressed and not being deleted (a deleting pod is never added, upstream #713)."""
        return self.ready and bool(self.pod_ip) and not self.deleting
