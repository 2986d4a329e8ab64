"""The production `ObjectReader`: the reconcilers' view of the informers' caches.

Reads are in-memory and synchronous; list results are sorted by key so every reconcile of the same
state makes the same decisions. A kind this generation does not watch (objectives under v1alpha2)
reads as empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Generic, Protocol, TypeVar

from epp.api.types import InferencePool, ModelRewrite, NamespacedName, Objective, PodObject

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class ObjectCache(Protocol[T_co]):
    """What the reader needs of an informer."""

    def get(self, key: NamespacedName) -> T_co | None: ...

    def objects(self) -> Sequence[T_co]: ...


class EmptyCache(Generic[T]):
    def get(self, key: NamespacedName) -> T | None:
        return None

    def objects(self) -> Sequence[T]:
        return ()


class CacheReader:
    def __init__(
        self,
        pools: ObjectCache[InferencePool],
        rewrites: ObjectCache[ModelRewrite],
        pods: ObjectCache[PodObject],
        objectives: ObjectCache[Objective] | None = None,
    ) -> None:
        self._pools = pools
        self._rewrites = rewrites
        self._pods = pods
        self._objectives: ObjectCache[Objective] = objectives if objectives is not None else EmptyCache()

    def get_pool(self, key: NamespacedName) -> InferencePool | None:
        return self._pools.get(key)

    def get_objective(self, key: NamespacedName) -> Objective | None:
        return self._objectives.get(key)

    def list_objectives(self, namespace: str) -> Sequence[Objective]:
        return sorted(
            (o for o in self._objectives.objects() if o.key.namespace == namespace), key=lambda o: o.key
        )

    def get_rewrite(self, key: NamespacedName) -> ModelRewrite | None:
        return self._rewrites.get(key)

    def list_rewrites(self, namespace: str) -> Sequence[ModelRewrite]:
        return sorted(
            (r for r in self._rewrites.objects() if r.key.namespace == namespace), key=lambda r: r.key
        )

    def get_pod(self, key: NamespacedName) -> PodObject | None:
        return self._pods.get(key)

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> Sequence[PodObject]:
        return sorted(
            (
                p
                for p in self._pods.objects()
                if p.key.namespace == namespace and all(p.labels.get(k) == v for k, v in selector.items())
            ),
            key=lambda p: p.key,
        )
