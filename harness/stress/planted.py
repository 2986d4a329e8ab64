"""Planted defects for proving that a check can fail: the EPP's pod reconciler reads pods through a
reader that lies about them.

A gate is only as good as the bugs it catches. The proofs of the settle barrier and of the
black-box oracle each run a real EPP with one deliberate defect, injected the way the product
allows (``Reconcilers``, through constructors), and show the check fails on it while passing on the
real EPP. No product code knows about it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from epp.api import NamespacedName, PodReader
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
