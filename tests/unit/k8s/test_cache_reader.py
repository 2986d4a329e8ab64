"""CacheReader, the reconcilers' view of the informers' caches: a list holds exactly the objects of
the namespace (and, for pods, of every selector label), sorted by key so each reconcile of the same
state decides the same way. Mutation testing found the pod filter's `and` could become `or` unseen."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

from epp.api.types import NamespacedName, Objective, PodObject, PoolRef
from epp.k8s.cache_reader import CacheReader, EmptyCache
from harness.cluster.releases import V1

T = TypeVar("T")


class Cache(Generic[T]):
    def __init__(self, *objects: T) -> None:
        self._objects = objects

    def get(self, key: NamespacedName) -> T | None:
        return next((o for o in self._objects if getattr(o, "key", None) == key), None)

    def objects(self) -> Sequence[T]:
        return self._objects


def pod(namespace: str, name: str, **labels: str) -> PodObject:
    return PodObject(NamespacedName(namespace, name), labels)


def objective(namespace: str, name: str) -> Objective:
    return Objective(NamespacedName(namespace, name), PoolRef(V1.pool_group, "pool"))


def test_pods_are_those_of_the_namespace_with_every_selector_label_sorted() -> None:
    pods = Cache(
        pod("ns", "b", app="vllm", tier="gpu"),
        pod("ns", "a", app="vllm", tier="gpu"),
        pod("ns", "c", app="vllm"),  # lacks a label
        pod("other", "d", app="vllm", tier="gpu"),  # another namespace
        pod("ns", "e", app="sglang", tier="gpu"),  # a label of another value
    )
    reader = CacheReader(EmptyCache(), EmptyCache(), pods)
    listed = reader.list_pods("ns", {"app": "vllm", "tier": "gpu"})
    assert [p.key.name for p in listed] == ["a", "b"]
    assert [p.key.name for p in reader.list_pods("other", {})] == ["d"], "an empty selector: the namespace"


def test_objectives_are_those_of_the_namespace_sorted() -> None:
    objectives = Cache(objective("ns", "z"), objective("other", "y"), objective("ns", "a"))
    reader = CacheReader(EmptyCache(), EmptyCache(), EmptyCache(), objectives)
    assert [o.key.name for o in reader.list_objectives("ns")] == ["a", "z"]
    assert reader.get_objective(NamespacedName("other", "y")) is not None


def test_a_kind_not_watched_reads_as_empty() -> None:
    reader = CacheReader(EmptyCache(), EmptyCache(), EmptyCache())
    assert reader.list_objectives("ns") == []
    assert reader.get_objective(NamespacedName("ns", "a")) is None
