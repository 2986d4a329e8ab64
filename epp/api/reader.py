"""The read side of the watch cache, as reconcilers see it.

Reconcilers are level-based: given a key they re-read current state through these Protocols. The
production implementation is backed by the informers' caches (epp.k8s); unit tests pass a dict-backed
fake. Every method is synchronous and cheap because it only reads memory. A kind the EPP does not
watch (objectives under v1alpha2) or cannot (an optional CRD absent) reads as empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from epp.api.types import InferencePool, ModelRewrite, NamespacedName, Objective, PodObject


class PodReader(Protocol):
    """All the pod reconciler reads."""

    def get_pod(self, key: NamespacedName) -> PodObject | None: ...

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> Sequence[PodObject]:
        """Pods in `namespace` whose labels contain every selector pair."""
        ...


class ObjectReader(PodReader, Protocol):
    def get_pool(self, key: NamespacedName) -> InferencePool | None:
        """None means NotFound."""
        ...

    def get_objective(self, key: NamespacedName) -> Objective | None: ...

    def list_objectives(self, namespace: str) -> Sequence[Objective]: ...

    def get_rewrite(self, key: NamespacedName) -> ModelRewrite | None: ...

    def list_rewrites(self, namespace: str) -> Sequence[ModelRewrite]: ...
