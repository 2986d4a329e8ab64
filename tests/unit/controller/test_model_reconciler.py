"""InferenceModel reconciler: the model rows of epp-behaviour.md §3.4 and bug §9.7 (upstream #393).

Each InferenceModel is stored as the rewrite it converts to (one exact rule on its modelName); the
oldest creationTimestamp owns a name, removal is by object identity, and the next oldest claimant
takes over when the owner goes (the store resolves precedence at lookup).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from epp.api import Criticality, NamespacedName

from .world import NS, World, model, pool


def key(name: str, ns: str = NS) -> NamespacedName:
    return NamespacedName(ns, name)


def with_pool(w: World) -> None:
    w.pool_event(pool().build())


def ours(w: World) -> None:
    with_pool(w)
    w.model_event(model("m1", "llama").build())


def other_pool(w: World) -> None:
    with_pool(w)
    w.model_event(model("m1", "llama", pool_name="elsewhere").build())


def other_pool_colliding(w: World) -> None:
    """#350 wrongly deleted our owner of the colliding modelName."""
    with_pool(w)
    w.model_event(model("mine", "llama", age_s=10).build())
    w.model_event(model("theirs", "llama", age_s=0, pool_name="elsewhere").build())


def other_namespace(w: World) -> None:
    with_pool(w)
    w.model_event(model("m1", "llama", ns="ns2").build())


def not_found(w: World) -> None:
    """#350 deleted key "" on NotFound, so the model stayed routable."""
    with_pool(w)
    w.model_event(model("m1", "llama").build())
    w.model_event(model("m2", "mistral").build())
    w.model_event(None, key=key("m1"))


def deleting(w: World) -> None:
    with_pool(w)
    w.model_event(model("m1", "llama").build())
    w.model_event(model("m1", "llama").deleting().build())


def moved_away(w: World) -> None:
    with_pool(w)
    w.model_event(model("m1", "llama").build())
    w.model_event(model("m1", "llama", pool_name="elsewhere").build())


def loser_moved_away(w: World) -> None:
    """#350 deleted by modelName: a rejected claimant leaving evicted the legitimate owner."""
    with_pool(w)
    w.model_event(model("owner", "llama", age_s=0).build())
    w.model_event(model("loser", "llama", age_s=10).build())
    w.model_event(model("loser", "llama", age_s=10, pool_name="elsewhere").build())


def loser_deleted(w: World) -> None:
    with_pool(w)
    w.model_event(model("owner", "llama", age_s=0).build())
    w.model_event(model("loser", "llama", age_s=10).build())
    w.model_event(None, key=key("loser"))


def newer_claimant_rejected(w: World) -> None:
    with_pool(w)
    w.model_event(model("old", "llama", age_s=0).build())
    w.model_event(model("new", "llama", age_s=10).build())


def older_claimant_takes_over(w: World) -> None:
    with_pool(w)
    w.model_event(model("new", "llama", age_s=10).build())
    w.model_event(model("old", "llama", age_s=0).build())


def tie_goes_to_the_first_name(w: World) -> None:
    """Timestamps have one-second resolution: equal ones are ordered by namespace/name (DESIGN §6)."""
    with_pool(w)
    w.model_event(model("b", "llama", age_s=5).build())
    w.model_event(model("a", "llama", age_s=5).build())


def tie_first_name_arrives_first(w: World) -> None:
    with_pool(w)
    w.model_event(model("a", "llama", age_s=5).build())
    w.model_event(model("b", "llama", age_s=5).build())


def owner_deleted_next_oldest_promoted(w: World) -> None:
    """Every claimant has been reconciled (as its informer event makes sure); the store keeps them all,
    so the owner's removal hands the name on without re-reading the cache."""
    with_pool(w)
    w.model_event(model("oldest", "llama", age_s=0).build())
    w.model_event(model("newest", "llama", age_s=20).build())
    w.model_event(model("middle", "llama", age_s=10).build())
    w.model_event(model("older-but-leaving", "llama", age_s=5).deleting().build())
    w.model_event(model("older-but-foreign", "llama", age_s=1, pool_name="elsewhere").build())
    w.model_event(None, key=key("oldest"))


def owner_moved_next_oldest_promoted(w: World) -> None:
    with_pool(w)
    w.model_event(model("oldest", "llama", age_s=0).build())
    w.model_event(model("next", "llama", age_s=10).build())
    w.model_event(model("oldest", "llama", age_s=0, pool_name="elsewhere").build())


def owner_deleted_no_claimant(w: World) -> None:
    with_pool(w)
    w.model_event(model("only", "llama").build())
    w.model_event(None, key=key("only"))


def deleted_before_any_pool(w: World) -> None:
    """Upstream's ModelResync dereferenced the nil pool here."""
    w.model_event(model("m1", "llama", age_s=0).build())
    w.put(model("m2", "llama", age_s=10).build())
    w.model_event(None, key=key("m1"))


def deleted_before_any_pool_then_pool(w: World) -> None:
    deleted_before_any_pool(w)
    with_pool(w)


def model_before_pool(w: World) -> None:
    """No pool, no models: a model of a pool that does not exist is not routable."""
    w.model_event(model("m1", "llama").build())


def model_before_pool_then_pool(w: World) -> None:
    model_before_pool(w)
    with_pool(w)


def never_stored_deleted(w: World) -> None:
    with_pool(w)
    w.model_event(None, key=key("ghost"))


@pytest.mark.parametrize(
    ("scenario", "owners"),
    [
        pytest.param(ours, {"llama": "m1"}, id="model-for-our-pool-stored"),
        pytest.param(other_pool, {}, id="model-for-other-pool-ignored"),
        pytest.param(other_pool_colliding, {"llama": "mine"}, id="other-pool-collision-keeps-ours"),
        pytest.param(other_namespace, {}, id="other-namespace-ignored"),
        pytest.param(not_found, {"mistral": "m2"}, id="notfound-removes-the-right-entry"),
        pytest.param(deleting, {}, id="deleting-removed"),
        pytest.param(moved_away, {}, id="moved-to-other-pool-removed"),
        pytest.param(loser_moved_away, {"llama": "owner"}, id="moved-loser-does-not-evict-owner"),
        pytest.param(loser_deleted, {"llama": "owner"}, id="deleted-loser-does-not-evict-owner"),
        pytest.param(newer_claimant_rejected, {"llama": "old"}, id="oldest-wins-newer-rejected"),
        pytest.param(older_claimant_takes_over, {"llama": "old"}, id="oldest-wins-older-takes-over"),
        pytest.param(tie_goes_to_the_first_name, {"llama": "a"}, id="equal-age-first-name-takes-over"),
        pytest.param(tie_first_name_arrives_first, {"llama": "a"}, id="equal-age-first-name-keeps-it"),
        pytest.param(owner_deleted_next_oldest_promoted, {"llama": "middle"}, id="owner-deleted-promotes"),
        pytest.param(owner_moved_next_oldest_promoted, {"llama": "next"}, id="owner-moved-promotes"),
        pytest.param(owner_deleted_no_claimant, {}, id="owner-deleted-nothing-to-promote"),
        pytest.param(deleted_before_any_pool, {}, id="delete-before-pool-no-crash"),
        pytest.param(deleted_before_any_pool_then_pool, {"llama": "m2"}, id="pool-arrival-relists-models"),
        pytest.param(model_before_pool, {}, id="model-before-pool-not-stored"),
        pytest.param(
            model_before_pool_then_pool, {"llama": "m1"}, id="model-before-pool-stored-when-pool-arrives"
        ),
        pytest.param(never_stored_deleted, {}, id="unknown-model-deleted-harmless"),
    ],
)
def test_model_events(scenario: Callable[[World], None], owners: dict[str, str]) -> None:
    w = World()
    scenario(w)
    assert w.model_owners() == owners


@pytest.mark.parametrize("arrival", [("a", "b"), ("b", "a")], ids=["a-then-b", "b-then-a"])
def test_equal_creation_seconds_resolve_alike_live_and_after_a_relist(arrival: tuple[str, str]) -> None:
    """One order everywhere: events one by one (live) and the pool's re-list (a restart) agree."""
    live = World()
    with_pool(live)
    for name in arrival:
        live.model_event(model(name, "llama", age_s=5).build())

    restarted = World()
    for name in arrival:
        restarted.put(model(name, "llama", age_s=5).build())
    with_pool(restarted)  # the pool's arrival lists every model, as after a restart or relist

    assert live.model_owners() == restarted.model_owners() == {"llama": "a"}


def test_owner_update_overwrites_its_own_entry() -> None:
    w = World()
    with_pool(w)
    w.model_event(model("m1", "llama").criticality("Sheddable").build())
    w.model_event(model("m1", "llama").criticality("Critical").target("lora-a", 1).build())
    stored = w.store.rewrite_match("llama")
    assert stored is not None
    assert stored.rewrite.objective is not None
    assert stored.rewrite.objective.criticality is Criticality.CRITICAL
    assert [t.name for t in stored.rule.targets] == ["lora-a"]


def test_rejected_claimant_update_changes_nothing() -> None:
    w = World()
    with_pool(w)
    w.model_event(model("old", "llama", age_s=0).criticality("Standard").build())
    w.model_event(model("new", "llama", age_s=10).criticality("Critical").build())
    stored = w.store.rewrite_match("llama")
    assert stored is not None
    assert stored.rewrite.objective is not None
    assert stored.rewrite.key == key("old")
    assert stored.rewrite.objective.criticality is Criticality.STANDARD


def test_model_name_changed_on_the_same_object_is_no_longer_routable_under_the_old_one() -> None:
    w = World()
    with_pool(w)
    w.model_event(model("m1", "llama").build())
    w.model_event(model("m1", "llama-v2").build())
    assert w.model_owners() == {"llama-v2": "m1"}
