"""The planted defects of `harness.stress.planted`: each lies exactly as its docstring says, and
only there (the scenarios that must fail on them are only as good as the lie)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from epp.api import InferencePool, ModelRewrite, NamespacedName, Objective, ObjectReader, PodObject, PoolRef
from epp.api.types import V1_GROUP, V1ALPHA2_GROUP
from harness.stress.planted import (
    LyingReader,
    OneListBehind,
    RanksNeverForgotten,
    binds_by_name,
    selector_blind,
)

POOL = InferencePool(NamespacedName("ns", "pool"), {"app": "mine"}, (8000, 8001), group=V1_GROUP)
MINE = PodObject(NamespacedName("ns", "a"), {"app": "mine"}, "10.0.0.1", ready=True)
THEIRS = PodObject(NamespacedName("ns", "b"), {"app": "theirs"}, "10.0.0.2", ready=True)
FOREIGN_REF = PoolRef(V1ALPHA2_GROUP, "pool")


class Reader:
    """A dict-backed `ObjectReader`."""

    def __init__(self) -> None:
        self.pool = POOL
        self.pods = [MINE, THEIRS]
        self.rewrite = ModelRewrite(NamespacedName("ns", "r"), FOREIGN_REF)

    def get_pool(self, key: NamespacedName) -> InferencePool | None:
        return self.pool

    def get_pod(self, key: NamespacedName) -> PodObject | None:
        return next((p for p in self.pods if p.key == key), None)

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> Sequence[PodObject]:
        return [p for p in self.pods if all(p.labels.get(k) == v for k, v in selector.items())]

    def get_objective(self, key: NamespacedName) -> Objective | None:
        return Objective(key, FOREIGN_REF)

    def list_objectives(self, namespace: str) -> Sequence[Objective]:
        return [Objective(NamespacedName("ns", "o"), FOREIGN_REF)]

    def get_rewrite(self, key: NamespacedName) -> ModelRewrite | None:
        return self.rewrite

    def list_rewrites(self, namespace: str) -> Sequence[ModelRewrite]:
        return [self.rewrite]


_typed: ObjectReader = Reader()
_lying: ObjectReader = LyingReader(Reader())


def test_a_reader_with_no_lie_passes_everything_through() -> None:
    inner = Reader()
    reader = LyingReader(inner)
    assert reader.get_pool(POOL.key) == POOL
    assert reader.list_pods("ns", {"app": "mine"}) == [MINE]
    assert reader.get_rewrite(NamespacedName("ns", "r")) == inner.rewrite


def test_ranks_never_forgotten_keeps_every_port_the_pool_ever_had() -> None:
    inner = Reader()
    reader = LyingReader(inner, pool=RanksNeverForgotten())
    assert reader.get_pool(POOL.key) == POOL
    inner.pool = dataclasses.replace(POOL, target_ports=(8000,))
    shrunk = reader.get_pool(POOL.key)
    assert shrunk is not None
    assert shrunk.target_ports == (8000, 8001)


def test_one_list_behind_returns_the_previous_list() -> None:
    inner = Reader()
    reader = LyingReader(inner, pod_list=OneListBehind())
    assert reader.list_pods("ns", {"app": "mine"}) == [MINE]  # the first list is current
    assert reader.list_pods("ns", {"app": "theirs"}) == [MINE]
    assert reader.list_pods("ns", {"app": "mine"}) == [THEIRS]


def test_selector_blind_makes_every_pod_of_the_namespace_the_pools() -> None:
    reader = LyingReader(Reader(), **selector_blind(lambda: POOL))
    assert {p.key.name for p in reader.list_pods("ns", {"app": "mine"}) if POOL.matches(p.labels)} == {
        "a",
        "b",
    }
    theirs = reader.get_pod(THEIRS.key)
    assert theirs is not None
    assert POOL.matches(theirs.labels)


def test_binds_by_name_rebinds_the_other_groups_objects_to_ours() -> None:
    honest, lying = Reader(), LyingReader(Reader(), **binds_by_name(lambda: POOL))
    assert not POOL.binds(honest.list_rewrites("ns")[0].pool_ref)
    assert POOL.binds(lying.list_rewrites("ns")[0].pool_ref)
    objective = lying.get_objective(NamespacedName("ns", "o"))
    assert objective is not None
    assert POOL.binds(objective.pool_ref)
