"""Pod reconciler: the pod rows of epp-behaviour.md §3.4 and bugs §9.1, §9.2, §9.17."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from epp.api import EndpointKey, NamespacedName
from epp.datastore import Metrics

from .world import NS, World, pod, pool

P1 = NamespacedName(NS, "p1")
E1 = EndpointKey(NS, "p1")


def with_pool(w: World) -> None:
    w.pool_event(pool().build())


def created_ready_matching(w: World) -> None:
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())


def created_unready(w: World) -> None:
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").unready("10.0.0.1").build())


def created_not_matching(w: World) -> None:
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1", app="other").build())


def ready_without_ip(w: World) -> None:
    with_pool(w)
    built = pod("p1", "10.0.0.1").build()
    del built["status"]["podIP"]
    w.pod_event(built)


def ip_changed(w: World) -> None:
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())
    w.pod_event(pod("p1", "10.0.0.9").build())


def recreated_new_ip(w: World) -> None:
    """Upstream #350: pods keyed by ip:port left the old entry behind on re-creation."""
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())
    w.pod_event(None, key=P1)
    w.pod_event(pod("p1", "10.0.0.9").build())


def became_unready(w: World) -> None:
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())
    w.pod_event(pod("p1", "10.0.0.1").unready("10.0.0.1").build())


def became_deleting(w: World) -> None:
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())
    w.pod_event(pod("p1", "10.0.0.1").deleting().build())


def labels_stopped_matching(w: World) -> None:
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())
    w.pod_event(pod("p1", "10.0.0.1", app="other").build())


def deleted(w: World) -> None:
    """Upstream #350: NotFound deleted an empty key, so the pod stayed."""
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())
    w.pod_event(None, key=P1)


def event_before_pool(w: World) -> None:
    """Upstream #696: the pod predicate dereferenced a nil pool."""
    w.pod_event(pod("p1", "10.0.0.1").build())
    w.pod_event(None, key=P1)
    w.pod_event(pod("p2", "10.0.0.2").build())


def other_namespace(w: World) -> None:
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1", ns="ns2").build())


def before_pool_then_pool(w: World) -> None:
    w.pod_event(pod("p1", "10.0.0.1").build())
    with_pool(w)


@pytest.mark.parametrize(
    ("scenario", "pods"),
    [
        pytest.param(created_ready_matching, {"p1": "10.0.0.1"}, id="created-ready-matching-added"),
        pytest.param(created_unready, {}, id="created-unready-ignored"),
        pytest.param(created_not_matching, {}, id="created-not-matching-ignored"),
        pytest.param(ready_without_ip, {}, id="ready-without-ip-ignored"),
        pytest.param(ip_changed, {"p1": "10.0.0.9"}, id="ip-changed-updated-in-place"),
        pytest.param(recreated_new_ip, {"p1": "10.0.0.9"}, id="pod-recreated-new-ip"),
        pytest.param(became_unready, {}, id="became-unready-removed"),
        pytest.param(became_deleting, {}, id="became-deleting-removed"),
        pytest.param(labels_stopped_matching, {}, id="labels-no-longer-match-removed"),
        pytest.param(deleted, {}, id="deleted-removed"),
        pytest.param(event_before_pool, {}, id="events-before-pool-ignored"),
        pytest.param(other_namespace, {}, id="other-namespace-ignored"),
        pytest.param(before_pool_then_pool, {"p1": "10.0.0.1"}, id="pool-arrival-picks-up-earlier-pods"),
    ],
)
def test_pod_events(scenario: Callable[[World], None], pods: dict[str, str]) -> None:
    w = World()
    scenario(w)
    assert w.pod_addresses() == pods


def test_new_pod_starts_with_never_scraped_metrics() -> None:
    w = World()
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())
    stored = w.store.pod_get(E1)
    assert stored is not None
    assert stored.metrics == Metrics()
    assert stored.metrics.updated_at is None
    assert w.listener.calls == [("added", E1)]


def test_update_keeps_metrics() -> None:
    """Upstream #350: any pod event replaced the metrics object."""
    w = World()
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())
    metrics = Metrics(waiting_queue_size=4, kv_cache_usage=0.5, updated_at=12.0)
    assert w.store.pod_update_metrics_if_exist(E1, metrics)

    w.pod_event(pod("p1", "10.0.0.9").labels(extra="x").build())

    stored = w.store.pod_get(E1)
    assert stored is not None
    assert stored.pod.address == "10.0.0.9"
    assert stored.metrics == metrics
    # An update never stops the refresher; a new address restarts its scrape (pod_moved).
    assert w.listener.calls == [("added", E1), ("moved", E1)]


def test_late_scrape_never_resurrects_a_deleted_pod() -> None:
    w = World()
    with_pool(w)
    w.pod_event(pod("p1", "10.0.0.1").build())
    w.pod_event(None, key=P1)

    assert not w.store.pod_update_metrics_if_exist(E1, Metrics(updated_at=1.0))
    assert w.store.pod_get(E1) is None
    assert w.listener.calls == [("added", E1), ("removed", E1)]


def test_repeated_events_are_idempotent() -> None:
    w = World()
    with_pool(w)
    for _ in range(3):
        w.pod_event(pod("p1", "10.0.0.1").build())
    for _ in range(2):
        w.pod_event(None, key=P1)
    assert w.listener.calls == [("added", E1), ("removed", E1)]
