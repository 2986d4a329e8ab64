"""The consistency oracle: what the EPP's datastore must hold, computed from the API server alone.

It is deliberately written from the API JSON and the rules of epp-behaviour.md §2.2 / DESIGN.md §2,
without reusing `epp`'s own parsing, so a bug shared by the EPP's parser and the oracle cannot hide.
Comparison is against the EPP's read-only debug view (`/debug/datastore`), never its internals.

Model ownership: the oldest creationTimestamp wins a modelName; timestamps have one-second
resolution, so claimants created in the same second are ordered by namespace/name (DESIGN.md §6).
The oracle names exactly that one owner: an EPP that resolved a tie one way live and another after a
restart must not pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

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


@dataclass(frozen=True)
class ObservedState:
    pool: tuple[str, str] | None
    target_port: int | None
    selector: Mapping[str, str]
    pods: Mapping[str, str]
    models: Mapping[str, str]  # modelName -> owner "ns/name"


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
    if pool is None or _deleting(pool):
        return ExpectedState(None, None, {}, {}, {})
    spec = pool["spec"]
    selector: dict[str, str] = dict(spec.get("selector") or {})
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
        if (m["spec"].get("poolRef") or {}).get("name") != pool_name:
            continue
        claimants.setdefault(str(m["spec"]["modelName"]), []).append(m)
    expected_models = {
        model_name: _name(min(objs, key=_claim_order)) for model_name, objs in claimants.items()
    }
    return ExpectedState(
        pool=(pool_namespace, pool_name),
        target_port=int(spec["targetPortNumber"]),
        selector=selector,
        pods=expected_pods,
        models=expected_models,
    )


def expected_from_api(kube: Kube, namespace: str, pool_name: str) -> ExpectedState:
    """``expected_state`` of what the API server holds now (both oracles, white-box and traffic)."""
    pools = [p for p in kube.pools.list(namespace) if p["metadata"]["name"] == pool_name]
    return expected_state(
        pools[0] if pools else None,
        kube.models.list(namespace),
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
    for name in sorted(set(expected.models) | set(observed.models)):
        owner, got = expected.models.get(name), observed.models.get(name)
        if owner is None:
            diffs.append(f"model {name!r}: expected absent, datastore has {got}")
        elif got != owner:
            diffs.append(f"model {name!r}: expected owner {owner}, datastore has {got or 'absent'}")
    return Verdict(expected, observed, tuple(diffs))
