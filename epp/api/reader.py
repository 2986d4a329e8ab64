"""The read side of the watch cache, as reconcilers see it.

Reconcilers are level-based: given a key they re-read current state through this Protocol. The
production implementation is backed by the informers' caches (epp.k8s); unit tests pass a dict-backed
fake. Every method is synchronous and cheap because it only reads memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from epp.api.types import InferenceModel, InferencePool, NamespacedName, PodObject


class ObjectReader(Protocol):
    def get_pool(self, key: NamespacedName) -> InferencePool | None:
        """None means NotFound."""
        ...

    def get_model(self, key: NamespacedName) -> InferenceModel | None: ...

    def list_models(self, namespace: str) -> Sequence[InferenceModel]: ...

    def get_pod(self, key: NamespacedName) -> PodObject | None: ...

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> Sequence[PodObject]:
        """Pods in `namespace` whose labels contain every selector pair."""
        ...
