"""The production `ObjectReader`: the reconcilers' view of the three informers' caches.

Reads are in-memory and synchronous; list results are sorted by key so every reconcile of the same
state makes the same decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from epp.api.types import InferenceModel, InferencePool, NamespacedName, PodObject

T_co = TypeVar("T_co", covariant=True)


class ObjectCache(Protocol[T_co]):
    """What the reader needs of an informer."""

    def get(self, key: NamespacedName) -> T_co | None: ...

    def objects(self) -> Sequence[T_co]: ...


class CacheReader:
    def __init__(
        self,
        pools: ObjectCache[InferencePool],
        models: ObjectCache[InferenceModel],
        pods: ObjectCache[PodObject],
    ) -> None:
        self._pools = pools
        self._models = models
        self._pods = pods

    def get_pool(self, key: NamespacedName) -> InferencePool | None:
        return self._pools.get(key)

    def get_model(self, key: NamespacedName) -> InferenceModel | None:
        return self._models.get(key)

    def list_models(self, namespace: str) -> Sequence[InferenceModel]:
        models = (m for m in self._models.objects() if m.key.namespace == namespace)
        return sorted(models, key=lambda m: m.key)

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
