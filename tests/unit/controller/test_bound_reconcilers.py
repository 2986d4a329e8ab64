"""Objective and rewrite reconcilers, and the v1 pool's endpoints per (pod, port), through
`reconcile()` with a fake reader and a real datastore (epp.controller.bound_reconcilers).

An object is stored iff it is in the pool's namespace, not being deleted, the pool is known, and its
poolRef names the pool's group, kind and name: upstream #1275 applied the objectives of a v1 pool to a
v1alpha2 pool of the same namespace and name.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from epp.api import NamespacedName
from epp.api.types import V1_GROUP, V1ALPHA2_GROUP
from tests.unit.api import objects

from .world import NS, World, model, pod, pool


def v1_pool(w: World, ports: tuple[int, ...] = (8000,)) -> None:
    w.pool_event(objects.pool_v1(ns=NS, ports=ports))


def old_pool(w: World) -> None:
    w.pool_event(pool().build())


@pytest.mark.parametrize(
    ("scenario", "stored"),
    [
        pytest.param(
            lambda w: (v1_pool(w), w.objective_event(objects.objective("o", 3))), {"o": 3}, id="bound"
        ),
        pytest.param(
            lambda w: (
                v1_pool(w),
                w.objective_event(objects.objective("o", ref=objects.pool_ref(group=V1_GROUP))),
            ),
            {"o": None},
            id="explicit-group",
        ),
        pytest.param(
            lambda w: (
                v1_pool(w),
                w.objective_event(objects.objective("o", 3, ref=objects.pool_ref(group=V1ALPHA2_GROUP))),
            ),
            {},
            id="same-name-other-group-issue-1275",
        ),
        pytest.param(
            lambda w: (old_pool(w), w.objective_event(objects.objective("o", 3))),
            {},
            id="v1-objective-not-for-a-v1alpha2-pool-issue-1275",
        ),
        pytest.param(
            lambda w: (
                v1_pool(w),
                w.objective_event(objects.objective("o", ref=objects.pool_ref(kind="Other"))),
            ),
            {},
            id="other-kind",
        ),
        pytest.param(
            lambda w: (
                v1_pool(w),
                w.objective_event(objects.objective("o", ref=objects.pool_ref("elsewhere"))),
            ),
            {},
            id="other-pool",
        ),
        pytest.param(
            lambda w: (v1_pool(w), w.objective_event(objects.objective("o", 3, ns="ns2"))),
            {},
            id="other-namespace",
        ),
        pytest.param(
            lambda w: (v1_pool(w), w.objective_event(objects.objective("o", 3, deleting=True))),
            {},
            id="deleting",
        ),
        pytest.param(
            lambda w: (
                v1_pool(w),
                w.objective_event(objects.objective("o", 3)),
                w.objective_event(objects.objective("o", 3, ref=objects.pool_ref("elsewhere"))),
            ),
            {},
            id="moved-away-removed",
        ),
        pytest.param(
            lambda w: (
                v1_pool(w),
                w.objective_event(objects.objective("o", 3)),
                w.objective_event(objects.objective("o", -4)),
            ),
            {"o": -4},
            id="update-replaces",
        ),
        pytest.param(
            lambda w: (
                v1_pool(w),
                w.objective_event(objects.objective("o", 3)),
                w.objective_event(None, key=key("o")),
            ),
            {},
            id="notfound-removes",
        ),
        pytest.param(lambda w: w.objective_event(objects.objective("o", 3)), {}, id="before-pool-not-stored"),
        pytest.param(
            lambda w: (w.objective_event(objects.objective("o", 3)), v1_pool(w)),
            {"o": 3},
            id="pool-arrival-relists",
        ),
        pytest.param(
            lambda w: (v1_pool(w), w.objective_event(objects.objective("o", 3)), w.pool_event(None)),
            {},
            id="pool-deleted-clears",
        ),
        pytest.param(
            lambda w: (
                v1_pool(w),
                w.objective_event(objects.objective("o", 3)),
                w.pool_event(None),
                v1_pool(w),
            ),
            {"o": 3},
            id="pool-recreated-relists",
        ),
        pytest.param(
            lambda w: (
                v1_pool(w),
                w.objective_event(objects.objective("o", 3)),
                w.objective_event(objects.objective("x", 5, ref=objects.pool_ref(group=V1ALPHA2_GROUP))),
                w.pool_event(None),
                v1_pool(w),
            ),
            {"o": 3},
            id="pool-recreated-relists-only-what-binds",
        ),
    ],
)
def test_objective_events(scenario: Callable[[World], object], stored: dict[str, int | None]) -> None:
    w = World()
    scenario(w)
    assert w.objectives() == stored


def key(name: str, ns: str = NS) -> NamespacedName:
    return NamespacedName(ns, name)


def test_rewrites_bind_by_group_and_the_next_oldest_takes_over() -> None:
    w = World()
    v1_pool(w)
    w.rewrite_event(objects.rewrite("old", objects.rule("llama", targets=[("old", 1)]), age_s=0))
    w.rewrite_event(objects.rewrite("young", objects.rule("llama", targets=[("young", 1)]), age_s=10))
    w.rewrite_event(
        objects.rewrite(
            "foreign", objects.rule("llama", targets=[("x", 1)]), ref=objects.pool_ref(group=V1ALPHA2_GROUP)
        )
    )
    assert w.model_owners() == {"llama": "old"}
    assert sorted(r.key.name for r in w.store.rewrite_get_all()) == ["old", "young"]
    w.rewrite_event(None, key=key("old"))
    assert w.model_owners() == {"llama": "young"}


def test_v1alpha2_models_do_not_bind_to_a_v1_pool() -> None:
    """An InferenceModel names a v1alpha2 pool; the same-named v1 pool is another pool."""
    w = World()
    v1_pool(w)
    w.model_event(model("m1", "llama").build())
    assert w.model_owners() == {}


@pytest.mark.parametrize(
    ("ports", "endpoints"),
    [
        pytest.param((8000, 8001), ["p1@8000", "p1@8001", "p2@8000", "p2@8001"], id="grow"),
        pytest.param((8001,), ["p1@8001", "p2@8001"], id="renumber"),
        pytest.param((8000,), ["p1@8000", "p2@8000"], id="unchanged"),
    ],
)
def test_pool_target_ports_change_through_the_reconciler(
    ports: tuple[int, ...], endpoints: list[str]
) -> None:
    w = World()
    w.put(pod("p1", "10.0.0.1").build())
    w.put(pod("p2", "10.0.0.2").build())
    v1_pool(w, (8000,))
    v1_pool(w, ports)
    assert w.endpoints() == endpoints
    # And back: a shrink leaves no stale rank (upstream #2306).
    v1_pool(w, (8000,))
    assert w.endpoints() == ["p1@8000", "p2@8000"]


def test_a_removal_is_logged_once_and_an_object_never_stored_is_not(caplog: pytest.LogCaptureFixture) -> None:
    """Operators read "objective … removed" as "it stopped applying": never for one that never did."""
    w = World()
    v1_pool(w)
    with caplog.at_level("INFO", logger="epp.controller.bound_reconcilers"):
        w.objective_event(objects.objective("foreign", 3, ref=objects.pool_ref(group=V1ALPHA2_GROUP)))
        w.objective_event(objects.objective("o", 3))
        w.rewrite_event(objects.rewrite("r", objects.rule("llama", targets=[("t", 1)])))
        w.objective_event(None, key=key("foreign"))
        w.objective_event(None, key=key("o"))
        w.rewrite_event(None, key=key("r"))
        w.rewrite_event(None, key=key("r"))  # already gone: nothing to say
        w.rewrite_event(None, key=key("never-stored"))
    assert [r.getMessage() for r in caplog.records] == [
        f"objective {key('o')} removed",
        f"rewrite {key('r')} removed",
    ]
