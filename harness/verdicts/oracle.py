"""The consistency oracle: what the EPP's datastore must hold, computed from the API server alone.

It is deliberately written from the API JSON and the rules of epp-behaviour.md §2.2 / DESIGN.md §2,
without reusing `epp`'s own parsing, so a bug shared by the EPP's parser and the oracle cannot hide.
Comparison is against the EPP's read-only debug view (`/debug/datastore`), never its internals.

Model ownership: the oldest creationTimestamp wins a modelName; timestamps have one-second
resolution, so claimants created in the same second are ordered by namespace/name (DESIGN.md §6).
The oracle names exactly that one owner: an EPP that resolved a tie one way live and another after a
restart must not pass.

Both API generations, read from their own fields: v1alpha2 (a plain-map selector,
``targetPortNumber``, InferenceModels claiming ``modelName``) and v1 (``selector.matchLabels``,
``targetPorts``: one endpoint per pod and port; InferenceModelRewrites whose Exact matches claim a
model name, the oldest rewrite winning as the oldest InferenceModel did). In both, ``poolRef`` binds
by group too (upstream #1275; v0.3.0 ignored it). The pool's group tells which one a pool object is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from harness.cluster.releases import V1, V1ALPHA2

if TYPE_CHECKING:
    from harness.cluster.kube import Kube

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class ExpectedState:
    pool: tuple[str, str] | None  # (namespace, name)
    target_port: int | None
    selector: Mapping[str, str]
    pods: Mapping[str, str]  # "ns/name" -> address
    models: Mapping[str, str]  # modelName -> owner "ns/name"
    ports: tuple[int, ...] = ()  # every target port: each pod is an endpoint on each


@dataclass(frozen=True)
class ObservedState:
    pool: tuple[str, str] | None
    target_port: int | None
    selector: Mapping[str, str]
    pods: Mapping[str, str]
    models: Mapping[str, str]  # modelName -> owner "ns/name"
    endpoints: frozenset[tuple[str, int]] = frozenset()  # ("ns/name", port), when the view says ports


@dataclass(frozen=True)
class Verdict:
    expected: ExpectedState
    observed: ObservedState
    differences: Sequence[str] = field(default_factory=tuple)

    @property
    def consistent(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        if self.consistent:
            return (
                f"consistent: pool={_fmt_pool(self.observed.pool)} pods={len(self.observed.pods)} "
                f"models={len(self.observed.models)}"
            )
        return "INCONSISTENT: " + "; ".join(self.differences)


def _fmt_pool(pool: tuple[str, str] | None) -> str:
    return "none" if pool is None else f"{pool[0]}/{pool[1]}"


def _name(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _deleting(obj: Obj) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _pod_ready(pod: Obj) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def expected_state(
    pool: Obj | None, models: Sequence[Obj], pods: Sequence[Obj], pool_namespace: str, pool_name: str
) -> ExpectedState:
    """``models``: InferenceModels for a v1alpha2 pool, InferenceModelRewrites for a v1 one."""
    if pool is None or _deleting(pool):
        return ExpectedState(None, None, {}, {}, {})
    v1 = str(pool.get("apiVersion", "")).split("/")[0] == V1.pool_group
    spec = pool["spec"]
    if v1:
        selector = dict((spec.get("selector") or {}).get("matchLabels") or {})
        ports = tuple(int(p["number"]) for p in spec.get("targetPorts") or ())
    else:
        selector = dict(spec.get("selector") or {})
        ports = (int(spec["targetPortNumber"]),)
    expected_pods = {
        _name(p): str(p["status"]["podIP"])
        for p in pods
        if p["metadata"].get("namespace") == pool_namespace
        and selector
        and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
        and _pod_ready(p)
        and (p.get("status") or {}).get("podIP")
        and not _deleting(p)
    }
    claimants: dict[str, list[Obj]] = {}
    for m in models:
        if m["metadata"].get("namespace") != pool_namespace or _deleting(m):
            continue
        ref = m["spec"].get("poolRef") or {}
        if ref.get("name") != pool_name:
            continue
        group = V1.pool_group if v1 else V1ALPHA2.pool_group
        if ref.get("group", group) != group:  # both generations bind by group too (upstream #1275)
            continue
        for model_name in _claimed_names(m, v1):
            claimants.setdefault(model_name, []).append(m)
    expected_models = {
        model_name: _name(min(objs, key=_claim_order)) for model_name, objs in claimants.items()
    }
    return ExpectedState(
        pool=(pool_namespace, pool_name),
        target_port=ports[0] if ports else None,
        selector=selector,
        pods=expected_pods,
        models=expected_models,
        ports=ports,
    )


def _claimed_names(model: Obj, v1: bool) -> list[str]:
    """The model names an object claims: an InferenceModel's ``modelName``; a rewrite's Exact matches."""
    if not v1:
        return [str(model["spec"]["modelName"])]
    return [
        str(match["model"]["value"])
        for rule in model["spec"].get("rules") or ()
        for match in rule.get("matches") or ()
        if (match.get("model") or {}).get("type", "Exact") == "Exact"
    ]


def expected_from_api(kube: Kube, namespace: str, pool_name: str) -> ExpectedState:
    """``expected_state`` of what the API server holds now (both oracles, white-box and traffic)."""
    pools = [p for p in kube.pools.list(namespace) if p["metadata"]["name"] == pool_name]
    return expected_state(
        pools[0] if pools else None,
        kube.claims.list(namespace),
        kube.pods.list(namespace),
        namespace,
        pool_name,
    )


def _claim_order(model: Obj) -> tuple[datetime, str, str]:
    meta = model["metadata"]
    created = datetime.fromisoformat(str(meta["creationTimestamp"]).replace("Z", "+00:00"))
    return (created, str(meta.get("namespace", "")), str(meta["name"]))


def observed_state(view: Obj) -> ObservedState:
    """Parse the EPP's `/debug/datastore` JSON."""
    pool = view.get("pool")
    return ObservedState(
        pool=(pool["namespace"], pool["name"]) if pool else None,
        target_port=int(pool["targetPortNumber"]) if pool else None,
        selector=dict(pool.get("selector") or {}) if pool else {},
        pods={f"{p['namespace']}/{p['name']}": str(p["address"]) for p in view.get("pods") or ()},
        models={str(m["modelName"]): f"{m['namespace']}/{m['name']}" for m in view.get("models") or ()},
        endpoints=frozenset(
            (f"{p['namespace']}/{p['name']}", int(p["port"])) for p in view.get("pods") or () if "port" in p
        ),
    )


def compare(expected: ExpectedState, observed: ObservedState) -> Verdict:
    diffs: list[str] = []
    if expected.pool != observed.pool:
        diffs.append(f"pool: expected {_fmt_pool(expected.pool)}, datastore has {_fmt_pool(observed.pool)}")
    elif expected.pool is not None:
        if expected.target_port != observed.target_port:
            diffs.append(f"pool port: expected {expected.target_port}, datastore has {observed.target_port}")
        if dict(expected.selector) != dict(observed.selector):
            diffs.append(
                f"pool selector: expected {dict(expected.selector)}, datastore has {dict(observed.selector)}"
            )
    for key in sorted(set(expected.pods) | set(observed.pods)):
        want, got = expected.pods.get(key), observed.pods.get(key)
        if want != got:
            diffs.append(f"pod {key}: expected {want or 'absent'}, datastore has {got or 'absent'}")
    if observed.endpoints and expected.ports:  # a view that names each endpoint's port
        want_endpoints = {(pod, port) for pod in expected.pods for port in expected.ports}
        for pod, port in sorted(want_endpoints ^ observed.endpoints):
            state = "missing" if (pod, port) in want_endpoints else "unexpected"
            diffs.append(f"endpoint {pod}:{port}: {state} in the datastore")
    for name in sorted(set(expected.models) | set(observed.models)):
        owner, got = expected.models.get(name), observed.models.get(name)
        if owner is None:
            diffs.append(f"model {name!r}: expected absent, datastore has {got}")
        elif got != owner:
            diffs.append(f"model {name!r}: expected owner {owner}, datastore has {got or 'absent'}")
    return Verdict(expected, observed, tuple(diffs))
