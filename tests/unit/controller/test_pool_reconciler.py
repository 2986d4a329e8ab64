"""InferencePool reconciler: the pool rows of epp-behaviour.md §3.4 and bugs §9.4, §9.5, §9.18.

Each case builds a world through the fake reader, fires pool/pod events the way informer + worker
would, and checks the real datastore.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from epp.api import EndpointKey, NamespacedName
from epp.datastore import Metrics

from .world import NS, POOL_KEY, World, model, pod, pool


def _mixed_pods(w: World) -> None:
    w.put(pod("ready", "10.0.0.1").build())
    w.put(pod("unready", "10.0.0.2").unready("10.0.0.2").build())
    w.put(pod("other-app", "10.0.0.3", app="other").build())
    w.put(pod("deleting", "10.0.0.4").deleting(datetime(2025, 1, 2, tzinfo=UTC)).build())
    w.put(pod("no-ip").namespace(NS).unready().build())
    w.put(pod("other-ns", "10.0.0.6", ns="ns2").build())
    w.put(pod("extra-label", "10.0.0.7", app="vllm", tier="gpu").build())


def created(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(pool().build())


def selector_changed(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(pool().build())
    w.pool_event(pool({"app": "other"}).build())


def selector_narrowed(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(pool().build())
    w.pool_event(pool({"app": "vllm", "tier": "gpu"}).build())


def deleted(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(pool().build())
    w.pool_event(None)


def deleting(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(pool().build())
    w.pool_event(pool().deleting().build())


def recreated(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(pool().build())
    w.pool_event(None)
    w.pool_event(pool().build())


def other_pool_name(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(pool(name="not-ours").build(), key=NamespacedName(NS, "not-ours"))


def other_pool_namespace(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(pool(ns="ns2").build(), key=NamespacedName("ns2", "pool"))


def empty_selector(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(pool().selector({}).build())


def deleted_before_ever_seen(w: World) -> None:
    _mixed_pods(w)
    w.pool_event(None)


@pytest.mark.parametrize(
    ("scenario", "pods", "pool_present"),
    [
        pytest.param(
            created, {"ready": "10.0.0.1", "extra-label": "10.0.0.7"}, True, id="pool-created-resyncs"
        ),
        pytest.param(selector_changed, {"other-app": "10.0.0.3"}, True, id="selector-changed-resyncs"),
        pytest.param(selector_narrowed, {"extra-label": "10.0.0.7"}, True, id="selector-narrowed-drops"),
        pytest.param(deleted, {}, False, id="pool-deleted-clears"),
        pytest.param(deleting, {}, False, id="pool-deleting-clears"),
        pytest.param(recreated, {"ready": "10.0.0.1", "extra-label": "10.0.0.7"}, True, id="pool-recreated"),
        pytest.param(other_pool_name, {}, False, id="other-pool-name-ignored"),
        pytest.param(other_pool_namespace, {}, False, id="other-pool-namespace-ignored"),
        pytest.param(empty_selector, {}, True, id="empty-selector-matches-nothing"),
        pytest.param(deleted_before_ever_seen, {}, False, id="notfound-before-any-pool-is-harmless"),
    ],
)
def test_pool_events(scenario: Callable[[World], None], pods: dict[str, str], pool_present: bool) -> None:
    w = World()
    scenario(w)
    assert w.pod_addresses() == pods
    assert w.store.pool_has_synced() is pool_present


def test_resync_never_adds_a_pod_marked_for_deletion() -> None:
    """Upstream #713: a resync added pods that already had a deletionTimestamp."""
    w = World()
    w.put(pod("going").deleting().build())
    w.pool_event(pool().build())
    assert w.store.pod_get(EndpointKey(NS, "going")) is None


def test_port_change_applies_without_pod_events() -> None:
    """Upstream #350/#417: the port lived with the pods and went stale. Here the store renumbers the
    endpoint when the pool changes: metrics kept, the prober told (its scrape of the old port is void),
    and no resync (a pod whose unready event has not arrived yet stays until that event)."""
    w = World()
    w.put(pod("p1", "10.0.0.1").build())
    w.pool_event(pool(port=8000).build())
    key = EndpointKey(NS, "p1")
    metrics = Metrics(waiting_queue_size=3, updated_at=1.0)
    assert w.store.pod_update_metrics_if_exist(key, metrics)
    calls = list(w.listener.calls)
    # The pod went unready meanwhile, without its event reaching us yet: a port change must not resync.
    w.put(pod("p1", "10.0.0.1").unready("10.0.0.1").build())

    w.pool_event(pool(port=9000).build())

    current = w.store.pool_get()
    assert current is not None
    assert current.target_port == 9000
    stored = w.store.pod_get(key)
    assert stored is not None
    assert (stored.pod.address, stored.pod.port, stored.metrics) == ("10.0.0.1", 9000, metrics)
    assert w.endpoints() == ["p1@9000"]
    assert w.listener.calls == [*calls, ("moved", key)]


def test_selector_change_keeps_metrics_of_pods_that_stay() -> None:
    w = World()
    w.put(pod("p1", "10.0.0.1", app="vllm", tier="gpu").build())
    w.pool_event(pool().build())
    key = EndpointKey(NS, "p1")
    metrics = Metrics(waiting_queue_size=2, updated_at=5.0)
    w.store.pod_update_metrics_if_exist(key, metrics)

    w.pool_event(pool({"tier": "gpu"}).build())

    stored = w.store.pod_get(key)
    assert stored is not None
    assert stored.metrics == metrics


def test_pool_deletion_stops_every_refresher_and_forgets_models() -> None:
    w = World()
    w.put(pod("p1", "10.0.0.1").build())
    w.put(pod("p2", "10.0.0.2").build())
    w.put(model("m1", "llama").build())
    w.pool_event(pool().build())
    assert w.model_owners() == {"llama": "m1"}

    w.pool_event(None)

    removed = sorted(key.name for what, key in w.listener.calls if what == "removed")
    assert removed == ["p1", "p2"]
    assert w.store.rewrite_get_all() == ()
    assert w.store.pool_get() is None


def test_recreated_pool_gets_its_models_back() -> None:
    """Upstream lost the models on pool re-creation until each model happened to change."""
    w = World()
    w.put(model("old", "llama", age_s=0).build())
    w.put(model("new", "llama", age_s=10).build())
    w.put(model("other-name", "mistral").build())
    w.put(model("foreign", "gemma", pool_name="someone-else").build())
    w.put(model("leaving", "phi").deleting().build())
    w.pool_event(pool().build())
    w.pool_event(None)
    assert w.model_owners() == {}

    w.pool_event(pool().build())

    assert w.model_owners() == {"llama": "old", "mistral": "other-name"}


def test_first_pool_relist_picks_the_oldest_claimant_whatever_the_list_order() -> None:
    w = World()
    # Name order ("a-newest" first) is the opposite of age order.
    w.put(model("a-newest", "llama", age_s=20).build())
    w.put(model("b-middle", "llama", age_s=10).build())
    w.put(model("c-oldest", "llama", age_s=0).build())
    w.pool_event(pool().build())
    assert w.model_owners() == {"llama": "c-oldest"}


def test_pool_key_is_the_configured_one() -> None:
    w = World()
    w.pool_event(pool().build())
    current = w.store.pool_get()
    assert current is not None
    assert current.key == POOL_KEY


def test_the_pool_s_lifecycle_is_told_to_an_operator_word_for_word(caplog: pytest.LogCaptureFixture) -> None:
    """What `-v` shows of the pool and its pods: the resync with its endpoint count, another pool
    ignored (naming the one served), a pod added at its address, the pool gone."""
    w = World()
    w.put(pod("ready", "10.0.0.1").build())
    with caplog.at_level("DEBUG", logger="epp.controller"):
        w.pool_event(pool().build())
        w.pool_event(pool(name="other").build())
        w.pod_event(pod("new", "10.0.0.2").build())
        w.pool_event(None)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("epp.controller")] == [
        f"pool {POOL_KEY}: pods resynced (1 endpoints)",
        f"ignoring pool {NamespacedName(NS, 'other')} (serving {POOL_KEY})",
        f"pod {NamespacedName(NS, 'new')} added at 10.0.0.2",
        f"pool {POOL_KEY} gone or deleting: clearing the datastore",
    ]
