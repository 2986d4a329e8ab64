"""Builders for test objects, shared by unit, integration and e2e tests.

Each builder produces API JSON (``dict[str, Any]`` with camelCase keys), the shape the API server
accepts and returns and the EPP parses, so one builder serves a fake reader in a unit test and a
``create`` through the real API server alike. For creation the server ignores ``status``,
``deletionTimestamp``, ``creationTimestamp`` and ``uid``; unit tests use them to build complete
objects. Builders emit only what was set (plus ``apiVersion``/``kind``/``metadata.name`` and, for
pods, a minimal valid spec), so leaving out a required field is how a test builds an invalid object.

    PodBuilder("p1").namespace(ns).labels(app="x").ready("127.0.0.5").build()      # forged (never bound)
    SimPodBuilder("p1").namespace(ns).labels(app="x").simulator(8000, ["--model=m"]).build()  # agent-run
    PoolBuilder("pool").namespace(ns).selector(app="x").port(8000).extension_ref("epp").build()
    ModelBuilder("m").model_name("llama").criticality("Critical").pool("pool").target("lora-a", weight=50)

This module imports nothing from ``kubernetes`` (unit tests of ``epp`` stay cheap).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Self

from harness.cluster.releases import MODEL_KINDS_API_VERSION, V1, V1ALPHA2, Generation

JsonObject = dict[str, Any]

DEFAULT_EPP_GRPC_PORT: Final = 9002  # the EPP's ext_proc port, v0.3.0's extensionRef default
OBJECTIVE_HEADER: Final = "x-gateway-inference-objective"  # names a v1 request's InferenceObjective
DEFAULT_NAMESPACE: Final = "default"
HOLD_FINALIZER: Final = "harness.test/hold"
SIM_CONTAINER: Final = "sim"
SIM_IMAGE: Final = "sim"
STAND_IN_SCHEDULER: Final = "epp-harness-kubelet-stand-in"
"""``spec.schedulerName`` of ``PodBuilder`` pods: no scheduler serves it, so the real kube-scheduler
leaves these pods alone (unbound, deleted at once) and the node agent never runs them, while
``harness.cluster.forged.ForgedKubelet`` writes their status."""
SIM_IMAGE_REF: Final = "epp-harness/vllm-sim:latest"
"""The image the node agent runs as our vLLM simulator (``harness.nodeagent.images``)."""
PROBE_PERIOD_ANNOTATION: Final = "epp-harness/probe-period-seconds"
"""Read by the node agent: probe this often (a harness knob; a kubelet's minimum is 1 s)."""
ADMIN_PORT_OFFSET: Final = 10000  # the simulator's admin listener: serving port + this


def rfc3339(moment: datetime) -> str:
    """Kubernetes' ``metav1.Time`` text: UTC, whole seconds, ``Z`` suffix. Naive datetimes are UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_conditions(ready: bool, transition_time: datetime) -> list[JsonObject]:
    """The pod conditions a kubelet reports for a running pod that is (or is not) Ready."""
    status = "True" if ready else "False"
    at = rfc3339(transition_time)
    conditions: list[JsonObject] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": at},
        {"type": "Initialized", "status": "True", "lastTransitionTime": at},
        {"type": "ContainersReady", "status": status, "lastTransitionTime": at},
        {"type": "Ready", "status": status, "lastTransitionTime": at},
    ]
    if not ready:
        for condition in conditions[2:]:
            condition["reason"] = "ContainersNotReady"
            condition["message"] = f"containers with unready status: [{SIM_CONTAINER}]"
    return conditions


def _merged_labels(labels: Mapping[str, str] | None, more: Mapping[str, str]) -> dict[str, str]:
    merged = dict(labels or {})
    merged.update(more)
    return merged


class _ObjectBuilder:
    """Metadata shared by every builder."""

    _api_version: str = "v1"
    _kind: str = ""

    def __init__(self, name: str) -> None:
        self._metadata: JsonObject = {"name": name, "namespace": DEFAULT_NAMESPACE}

    @property
    def name(self) -> str:
        return str(self._metadata["name"])

    def namespace(self, namespace: str) -> Self:
        self._metadata["namespace"] = namespace
        return self

    def labels(self, labels: Mapping[str, str] | None = None, /, **more: str) -> Self:
        """Add labels; pass a mapping for keys that are not identifiers (``"app.kubernetes.io/name"``)."""
        self._metadata.setdefault("labels", {}).update(_merged_labels(labels, more))
        return self

    def annotations(self, annotations: Mapping[str, str] | None = None, /, **more: str) -> Self:
        self._metadata.setdefault("annotations", {}).update(_merged_labels(annotations, more))
        return self

    def created_at(self, moment: datetime) -> Self:
        """``metadata.creationTimestamp`` (whole seconds, as the API stores it)."""
        self._metadata["creationTimestamp"] = rfc3339(moment)
        return self

    def uid(self, uid: str) -> Self:
        self._metadata["uid"] = uid
        return self

    def resource_version(self, resource_version: str) -> Self:
        self._metadata["resourceVersion"] = resource_version
        return self

    def generation(self, generation: int) -> Self:
        self._metadata["generation"] = generation
        return self

    def finalizers(self, *finalizers: str) -> Self:
        existing = self._metadata.setdefault("finalizers", [])
        existing.extend(f for f in finalizers if f not in existing)
        return self

    def deleting(self, at: datetime | None = None) -> Self:
        """Mark the object as being deleted (``deletionTimestamp``), held by ``HOLD_FINALIZER``.

        A real object only lingers with a deletionTimestamp while a finalizer holds it, so one is
        added unless the object already has finalizers.
        """
        self._metadata["deletionTimestamp"] = rfc3339(at or datetime.now(UTC))
        self._metadata.setdefault("deletionGracePeriodSeconds", 0)
        if not self._metadata.get("finalizers"):
            self.finalizers(HOLD_FINALIZER)
        return self

    def _object(self) -> JsonObject:
        return {
            "apiVersion": self._api_version,
            "kind": self._kind,
            "metadata": copy.deepcopy(self._metadata),
        }


class PodBuilder(_ObjectBuilder):
    """A stand-in Pod with one container (image ``sim``): never bound, so nothing ever runs it; its
    status is whatever ``harness.cluster.forged.ForgedKubelet`` (or a unit test) says."""

    _kind = "Pod"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._status: JsonObject | None = None

    def ready(self, ip: str, at: datetime | None = None) -> Self:
        """Running, with ``podIP``/``podIPs`` = ``ip`` and Ready/ContainersReady True."""
        return self._running(ip, ready=True, at=at)

    def unready(self, ip: str | None = None, at: datetime | None = None) -> Self:
        """Running but not Ready (with an IP if given, as after a failed readiness probe)."""
        return self._running(ip, ready=False, at=at)

    def pending(self) -> Self:
        """Phase Pending, no IP, no conditions (created but not started)."""
        self._status = {"phase": "Pending"}
        return self

    def phase(self, phase: str) -> Self:
        """Override the phase only (e.g. ``"Succeeded"``, ``"Failed"``), keeping the rest of the status."""
        self._status = {**(self._status or {}), "phase": phase}
        return self

    def _running(self, ip: str | None, ready: bool, at: datetime | None) -> Self:
        moment = at or datetime.now(UTC)
        status: JsonObject = {
            "phase": "Running",
            "conditions": ready_conditions(ready, moment),
            "containerStatuses": [container_status(ready, moment)],
            "startTime": rfc3339(moment),
        }
        if ip is not None:
            status["podIP"] = ip
            status["podIPs"] = [{"ip": ip}]
        self._status = status
        return self

    @property
    def ip(self) -> str | None:
        """The podIP set by ``ready``/``unready``, if any."""
        if self._status is None:
            return None
        ip = self._status.get("podIP")
        return str(ip) if ip is not None else None

    @property
    def is_ready(self) -> bool:
        conditions = (self._status or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def spec_dict(self) -> JsonObject:
        container: JsonObject = {"name": SIM_CONTAINER, "image": SIM_IMAGE}
        return {"schedulerName": STAND_IN_SCHEDULER, "containers": [container]}

    def status_dict(self) -> JsonObject | None:
        """The status set on the builder (None if none was), for fakes or a status patch."""
        return copy.deepcopy(self._status)

    def build(self) -> JsonObject:
        pod = self._object()
        pod["spec"] = self.spec_dict()
        if self._status is not None:
            pod["status"] = copy.deepcopy(self._status)
        return pod


class SimPodBuilder(_ObjectBuilder):
    """A Pod the node agent runs: one simulator container per port, each with a readiness probe on
    ``/health`` (which the simulator's admin port can make fail) and its admin port declared."""

    _kind = "Pod"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._containers: list[JsonObject] = []
        self._spec: JsonObject = {}
        self._pre_stop: int | None = None

    def simulator(
        self, port: int, args: Sequence[str] = (), *, healthy: bool = True, image: str = SIM_IMAGE_REF
    ) -> Self:
        """A simulator container serving ``port`` (``args``: ``python -m harness.sim`` flags)."""
        name = SIM_CONTAINER if not self._containers else f"{SIM_CONTAINER}-{port}"
        flags = [f"--port={port}", *args, *([] if healthy else ["--fail-health"])]
        self._containers.append(
            {
                "name": name,
                "image": image,
                "args": flags,
                "ports": [
                    {"name": "http" if not self._containers else f"http-{port}", "containerPort": port},
                    {"name": "admin" if not self._containers else f"admin-{port}",
                     "containerPort": port + ADMIN_PORT_OFFSET},
                ],
                # A kubelet's default failureThreshold: one slow /health on a loaded box must not
                # take a pod out of rotation (a readiness flip still takes 3 probe periods).
                "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 1,
                                   "failureThreshold": 3},
            }
        )  # fmt: skip
        return self

    def probe_period(self, seconds: float) -> Self:
        """Probe faster than a kubelet can (``PROBE_PERIOD_ANNOTATION``): readiness flips in tests."""
        return self.annotations({PROBE_PERIOD_ANNOTATION: f"{seconds:g}"})

    def pre_stop(self, seconds: int) -> Self:
        """Each container sleeps ``seconds`` in a preStop hook (still Ready, as in a drain) before SIGTERM."""
        self._pre_stop = seconds
        return self

    def grace_period(self, seconds: int) -> Self:
        self._spec["terminationGracePeriodSeconds"] = seconds
        return self

    def build(self) -> JsonObject:
        pod = self._object()
        containers = copy.deepcopy(self._containers)
        if self._pre_stop is not None:
            for container in containers:
                container["lifecycle"] = {"preStop": {"sleep": {"seconds": self._pre_stop}}}
        pod["spec"] = {**copy.deepcopy(self._spec), "containers": containers}
        return pod


def container_status(ready: bool, started_at: datetime) -> JsonObject:
    """The status of the single ``sim`` container of a running pod."""
    return {
        "name": SIM_CONTAINER,
        "image": SIM_IMAGE,
        "imageID": "",
        "ready": ready,
        "started": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": rfc3339(started_at)}},
    }


class PoolBuilder(_ObjectBuilder):
    """An InferencePool, described once and rendered for either generation by ``build``.

    v1alpha2: ``selector`` a plain map, ``targetPortNumber``, ``extensionRef``. v1: ``selector.matchLabels``,
    ``targetPorts`` (one entry per port), ``endpointPickerRef`` (its ``port`` required for a Service,
    so it defaults to the EPP's gRPC port), ``appProtocol``.
    """

    _kind = "InferencePool"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._selector: dict[str, str] | None = None
        self._ports: list[int] = []
        self._picker: JsonObject | None = None
        self._app_protocol: str | None = None

    def selector(self, labels: Mapping[str, str] | None = None, /, **more: str) -> Self:
        """Set (replace) the selector; pass a mapping for keys that are not identifiers."""
        self._selector = _merged_labels(labels, more)
        return self

    def port(self, port: int) -> Self:
        """The one target port (``targetPortNumber``; v1: ``targetPorts: [{number}]``)."""
        self._ports = [port]
        return self

    def ports(self, *ports: int) -> Self:
        """v1 ``targetPorts`` (data-parallel ranks); v1alpha2 has room for the first one only."""
        self._ports = list(ports)
        return self

    def app_protocol(self, protocol: str) -> Self:
        """v1 ``appProtocol`` (``http`` or ``kubernetes.io/h2c``); v1alpha2 has no such field."""
        self._app_protocol = protocol
        return self

    def extension_ref(
        self,
        name: str,
        *,
        port: int | None = None,
        failure_mode: str | None = None,
        kind: str | None = None,
        group: str | None = None,
    ) -> Self:
        """The EPP's reference (v1alpha2 ``extensionRef``, v1 ``endpointPickerRef``); unset fields
        are left to the CRD defaults."""
        self._picker = {"name": name, "port": port, "failureMode": failure_mode, "kind": kind, "group": group}
        return self

    def build(self, generation: Generation = V1ALPHA2) -> JsonObject:
        pool = self._object()
        pool["apiVersion"] = generation.pool_api_version
        pool["spec"] = self._v1_spec() if generation is V1 else self._v1alpha2_spec()
        return pool

    def _v1alpha2_spec(self) -> JsonObject:
        spec: JsonObject = {}
        if self._selector is not None:
            spec["selector"] = dict(self._selector)
        if self._ports:
            spec["targetPortNumber"] = self._ports[0]
        if self._picker is not None:
            ref = {k: v for k, v in self._picker.items() if v is not None and k != "port"}
            if self._picker["port"] is not None:
                ref["portNumber"] = self._picker["port"]
            spec["extensionRef"] = ref
        return spec

    def _v1_spec(self) -> JsonObject:
        spec: JsonObject = {}
        if self._selector is not None:
            spec["selector"] = {"matchLabels": dict(self._selector)}
        if self._ports:
            spec["targetPorts"] = [{"number": port} for port in self._ports]
        if self._app_protocol is not None:
            spec["appProtocol"] = self._app_protocol
        if self._picker is not None:
            ref = {k: v for k, v in self._picker.items() if v is not None and k != "port"}
            ref["port"] = {"number": self._picker["port"] or DEFAULT_EPP_GRPC_PORT}
            spec["endpointPickerRef"] = ref
        return spec


class ModelBuilder(_ObjectBuilder):
    """A served model, described once (v0.3's InferenceModel: a model name with a criticality and
    weighted targets, bound to a pool) and rendered for either generation.

    ``build()`` is the v1alpha2 InferenceModel. ``objects(V1)`` is what v1 says with two kinds, both
    named like the InferenceModel: an InferenceModelRewrite whose one rule matches the model name
    exactly (targets as given, else the model itself: a rewrite needs one target) and an
    InferenceObjective whose priority is the criticality's (epp-behaviour.md §5.3: v0.3.0 sheds
    Standard and unset as it sheds Sheddable, so Critical 1, Standard and unset -1, Sheddable -2).
    A v1 request names its objective in a header (``objective_headers``): the harness sends it.
    """

    _api_version = MODEL_KINDS_API_VERSION  # InferenceModel; InferenceObjective and the rewrite too
    _kind = "InferenceModel"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._spec: JsonObject = {}

    @property
    def served_model(self) -> str:
        return str(self._spec.get("modelName", self.name))

    def model_name(self, model_name: str) -> Self:
        self._spec["modelName"] = model_name
        return self

    def criticality(self, criticality: str) -> Self:
        """``Critical``, ``Standard`` or ``Sheddable`` (unset: the EPP treats it as Standard)."""
        self._spec["criticality"] = criticality
        return self

    def pool(self, name: str, *, group: str | None = None, kind: str | None = None) -> Self:
        """``spec.poolRef``; group and kind are left to the CRD defaults unless given."""
        ref: JsonObject = {"name": name}
        if group is not None:
            ref["group"] = group
        if kind is not None:
            ref["kind"] = kind
        self._spec["poolRef"] = ref
        return self

    def target(self, name: str, weight: int | None = None) -> Self:
        """Append one ``spec.targetModels`` entry."""
        entry: JsonObject = {"name": name}
        if weight is not None:
            entry["weight"] = weight
        self._spec.setdefault("targetModels", []).append(entry)
        return self

    def build(self) -> JsonObject:
        model = self._object()
        model["spec"] = copy.deepcopy(self._spec)
        return model

    def objects(self, generation: Generation) -> list[tuple[str, JsonObject]]:
        """``(kind, body)`` of every object that says this in ``generation``."""
        if generation is not V1:
            return [("InferenceModel", self.build())]
        return [("InferenceModelRewrite", self.rewrite()), ("InferenceObjective", self.objective())]

    def rewrite(self) -> JsonObject:
        """The v1 InferenceModelRewrite of this model."""
        targets = [
            {"modelRewrite": t["name"], **({"weight": t["weight"]} if "weight" in t else {})}
            for t in self._spec.get("targetModels") or ()
        ] or [{"modelRewrite": self.served_model}]
        rule = {"matches": [{"model": {"type": "Exact", "value": self.served_model}}], "targets": targets}
        body = self._v1_object("InferenceModelRewrite")
        body["spec"] = {"poolRef": self._v1_pool_ref(), "rules": [rule]}
        return body

    def objective(self) -> JsonObject:
        """The v1 InferenceObjective of this model."""
        body = self._v1_object("InferenceObjective")
        priority = CRITICALITY_PRIORITY[self._spec.get("criticality")]
        body["spec"] = {"poolRef": self._v1_pool_ref(), "priority": priority}
        return body

    def _v1_object(self, kind: str) -> JsonObject:
        body = self._object()
        body["kind"] = kind
        return body

    def _v1_pool_ref(self) -> JsonObject:
        ref = dict(self._spec.get("poolRef") or {})
        ref.setdefault("group", V1.pool_group)
        return ref


# How v1 says a v0.3 criticality (``ModelBuilder``).
CRITICALITY_PRIORITY: Final[Mapping[str | None, int]] = {
    "Critical": 1,
    "Standard": -1,
    None: -1,
    "Sheddable": -2,
}


def objective_headers(objective: str | None, generation: Generation) -> dict[str, str]:
    """The request header that names an InferenceObjective (``ModelBuilder.objective``'s name) in a
    v1 cluster; nothing in a v1alpha2 one, where the model name implies the criticality."""
    return {OBJECTIVE_HEADER: objective} if objective and generation is V1 else {}
