"""Planted defects for proving that a check can fail: the EPP's reconcilers read the API through a
reader that lies about it (pods, the pool, what objectives and rewrites bind to).

A gate is only as good as the bugs it catches. The proofs of the settle barrier and of the
black-box oracle each run a real EPP with one deliberate defect, injected the way the product
allows (``Reconcilers``, through constructors), and show the check fails on it while passing on the
real EPP. No product code knows about it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from epp.api import InferencePool, ModelRewrite, NamespacedName, Objective, ObjectReader, PodReader, PoolRef
from epp.api.types import PodObject

PodLie = Callable[[PodObject], PodObject]


class PodRewritingReader:
    """A ``PodReader`` (what the pod reconciler reads) that rewrites every pod with ``lie``."""

    def __init__(self, inner: PodReader, lie: PodLie) -> None:
        self._inner = inner
        self._lie = lie

    def get_pod(self, key: NamespacedName) -> PodObject | None:
        pod = self._inner.get_pod(key)
        return None if pod is None else self._lie(pod)

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> Sequence[PodObject]:
        return [self._lie(p) for p in self._inner.list_pods(namespace, selector)]


def always_ready(pod: PodObject) -> PodObject:
    """Every pod reports Ready (a readiness-blind EPP)."""
    return dataclasses.replace(pod, ready=True)


def never_deleting(pod: PodObject) -> PodObject:
    """No pod is being deleted (upstream #713: a resync forgot the deletionTimestamp)."""
    return dataclasses.replace(pod, deleting=False)


# ---------------------------------------------------------------------------------------------------
# Whole-reader defects: the bug classes upstream fixed after v0.3.0 (upstream-v1.md §g), each planted
# through `Reconcilers` by `tests.e2e.planted_epp` so the EPP-agnostic scenario that guards it can be
# shown to fail. ``store_pool`` is the pool the planted EPP holds (its datastore's), read at call time.

StorePool = Callable[[], InferencePool | None]
_Bound = TypeVar("_Bound", Objective, ModelRewrite)


class LyingReader:
    """An ``ObjectReader`` that passes every read through, except what the defect rewrites:
    ``pool`` rewrites the pool read, ``pods`` turns a pod read into another (or none), and
    ``pod_selector`` says what selector a pod list really uses, ``pod_list`` which list it returns."""

    def __init__(
        self,
        inner: ObjectReader,
        *,
        pool: Callable[[InferencePool], InferencePool] = lambda p: p,
        pod: PodLie = lambda p: p,
        pod_selector: Callable[[Mapping[str, str]], Mapping[str, str]] = lambda s: s,
        pool_ref: Callable[[PoolRef], PoolRef] = lambda r: r,
        pod_list: Callable[[Sequence[PodObject]], Sequence[PodObject]] = lambda pods: pods,
    ) -> None:
        self._inner = inner
        self._pool = pool
        self._pod = pod
        self._pod_selector = pod_selector
        self._pool_ref = pool_ref
        self._pod_list = pod_list

    def get_pool(self, key: NamespacedName) -> InferencePool | None:
        pool = self._inner.get_pool(key)
        return None if pool is None else self._pool(pool)

    def get_pod(self, key: NamespacedName) -> PodObject | None:
        pod = self._inner.get_pod(key)
        return None if pod is None else self._pod(pod)

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> Sequence[PodObject]:
        listed = self._inner.list_pods(namespace, self._pod_selector(selector))
        return [self._pod(p) for p in self._pod_list(listed)]

    def get_objective(self, key: NamespacedName) -> Objective | None:
        objective = self._inner.get_objective(key)
        return None if objective is None else self._rebind(objective)

    def list_objectives(self, namespace: str) -> Sequence[Objective]:
        return [self._rebind(o) for o in self._inner.list_objectives(namespace)]

    def get_rewrite(self, key: NamespacedName) -> ModelRewrite | None:
        rewrite = self._inner.get_rewrite(key)
        return None if rewrite is None else self._rebind(rewrite)

    def list_rewrites(self, namespace: str) -> Sequence[ModelRewrite]:
        return [self._rebind(r) for r in self._inner.list_rewrites(namespace)]

    def _rebind(self, obj: _Bound) -> _Bound:
        return dataclasses.replace(obj, pool_ref=self._pool_ref(obj.pool_ref))


class RanksNeverForgotten:
    """Upstream #2306: after ``targetPorts`` shrank, the endpoints of the removed ranks stayed. The
    pool read keeps every target port it has ever carried."""

    def __init__(self) -> None:
        self._seen: list[int] = []

    def __call__(self, pool: InferencePool) -> InferencePool:
        self._seen += [port for port in pool.target_ports if port not in self._seen]
        return dataclasses.replace(pool, target_ports=tuple(self._seen))


def selector_blind(store_pool: StorePool) -> dict[str, Any]:
    """Every pod of the namespace is the pool's (upstream #946/#724: one namespace, two pools, each
    EPP picks the other's pods): pod lists ignore the selector and every pod wears the pool's labels."""

    def wear_pool_labels(pod: PodObject) -> PodObject:
        pool = store_pool()
        labels = {**pod.labels, **(pool.selector if pool is not None else {})}
        return dataclasses.replace(pod, labels=labels)

    return {"pod": wear_pool_labels, "pod_selector": lambda _selector: {}}


def binds_by_name(store_pool: StorePool) -> dict[str, Any]:
    """Upstream #1275: objectives and rewrites bound by the pool's name alone, so those of a
    same-named pool in the other API group applied to ours."""

    def ours(ref: PoolRef) -> PoolRef:
        pool = store_pool()
        return ref if pool is None else dataclasses.replace(ref, group=pool.group)

    return {"pool_ref": ours}


class OneListBehind:
    """Upstream llm-d-router #2060's outcome: a pool resync that races pod reconciles applies a pod
    list from before the latest change, and the Ready pods it lacks stay dropped until some later event
    of theirs. Each pod list returned is the one the previous call got (the first is current)."""

    def __init__(self) -> None:
        self._previous: Sequence[PodObject] | None = None

    def __call__(self, pods: Sequence[PodObject]) -> Sequence[PodObject]:
        stale = pods if self._previous is None else self._previous
        self._previous = list(pods)
        return stale
