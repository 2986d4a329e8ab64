"""The datastore implementation behind the `Datastore` Protocol (epp-behaviour.md §2, DESIGN.md §2)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from epp.api import InferenceModel, InferencePool, NamespacedName, PodObject
from epp.datastore import Datastore, Metrics, new_datastore
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder

NS = "ns1"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def pod(name: str, ip: str = "10.0.0.1") -> PodObject:
    return PodObject.from_api(PodBuilder(name).namespace(NS).labels(app="vllm").ready(ip, at=T0).build())


def unready(name: str, ip: str = "10.0.0.1") -> PodObject:
    return PodObject.from_api(PodBuilder(name).namespace(NS).labels(app="vllm").unready(ip, at=T0).build())


def pool(port: int = 8000) -> InferencePool:
    built = PoolBuilder("pool").namespace(NS).selector(app="vllm").port(port).extension_ref("epp").build()
    return InferencePool.from_api(built)


def model(name: str, model_name: str, age_s: int = 0, criticality: str = "Standard") -> InferenceModel:
    built = (
        ModelBuilder(name)
        .namespace(NS)
        .model_name(model_name)
        .pool("pool")
        .criticality(criticality)
        .created_at(T0 + timedelta(seconds=age_s))
        .build()
    )
    return InferenceModel.from_api(built)


def key(name: str) -> NamespacedName:
    return NamespacedName(NS, name)


class Recorder:
    """A PodLifecycleListener that also proves calls happen outside the lock by reading the store."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.seen_by_add: list[bool] = []
        self.moved_to: list[str] = []
        self.store: Datastore | None = None

    def pod_added(self, key: NamespacedName, store: Datastore) -> None:
        self.calls.append(("added", key.name))
        # Would deadlock (threading.Lock is not re-entrant) if called under the store's lock.
        self.seen_by_add.append(store.pod_get(key) is not None)
        self.store = store

    def pod_removed(self, key: NamespacedName) -> None:
        self.calls.append(("removed", key.name))
        assert self.store is not None
        assert self.store.pod_get(key) is None

    def pod_moved(self, key: NamespacedName, store: Datastore) -> None:
        self.calls.append(("moved", key.name))
        stored = store.pod_get(key)  # outside the lock, and already at the new address
        assert stored is not None
        self.moved_to.append(stored.pod.address)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def store(recorder: Recorder) -> Datastore:
    return new_datastore(recorder)


# --- pods -------------------------------------------------------------------------------------
@pytest.mark.timeout(10)
def test_add_then_update_keeps_metrics_and_changes_address(store: Datastore, recorder: Recorder) -> None:
    assert store.pod_update_or_add(pod("p1", "10.0.0.1")) is True
    metrics = Metrics(waiting_queue_size=7, updated_at=3.0)
    assert store.pod_update_metrics_if_exist(key("p1"), metrics)

    assert store.pod_update_or_add(pod("p1", "10.0.0.2")) is False

    stored = store.pod_get(key("p1"))
    assert stored is not None
    assert stored.pod.address == "10.0.0.2"
    assert stored.metrics == metrics
    # The prober hears of the move (its scrape of the old address is void), after the store changed.
    assert recorder.calls == [("added", "p1"), ("moved", "p1")]
    assert recorder.seen_by_add == [True]
    assert recorder.moved_to == ["10.0.0.2"]


def test_pod_is_keyed_by_name_only(store: Datastore) -> None:
    store.pod_update_or_add(pod("p1", "10.0.0.1"))
    store.pod_update_or_add(pod("p1", "10.0.0.9"))
    assert [pm.pod.address for pm in store.pod_get_all()] == ["10.0.0.9"]
    store.pod_delete(key("p1"))
    assert store.pod_get_all() == ()


def test_same_address_is_not_a_move(store: Datastore, recorder: Recorder) -> None:
    store.pod_update_or_add(pod("p1", "10.0.0.1"))
    store.pod_update_or_add(pod("p1", "10.0.0.1"))
    store.pod_resync([pod("p1", "10.0.0.1")])
    assert recorder.calls == [("added", "p1")]


def test_metrics_of_an_old_address_are_not_written(store: Datastore) -> None:
    store.pod_update_or_add(pod("p1", "10.0.0.1"))
    store.pod_update_or_add(pod("p1", "10.0.0.2"))
    assert not store.pod_update_metrics_if_exist(key("p1"), Metrics(updated_at=1.0), address="10.0.0.1")
    assert store.pod_update_metrics_if_exist(key("p1"), Metrics(updated_at=2.0), address="10.0.0.2")
    stored = store.pod_get(key("p1"))
    assert stored is not None
    assert stored.metrics.updated_at == 2.0


@pytest.mark.timeout(10)
def test_metrics_only_written_for_present_pods(store: Datastore, recorder: Recorder) -> None:
    assert not store.pod_update_metrics_if_exist(key("ghost"), Metrics(updated_at=1.0))
    store.pod_update_or_add(pod("p1"))
    store.pod_delete(key("p1"))
    assert not store.pod_update_metrics_if_exist(key("p1"), Metrics(updated_at=2.0))
    assert store.pod_get(key("p1")) is None
    assert recorder.calls == [("added", "p1"), ("removed", "p1")]


def test_delete_of_absent_pod_tells_nobody(store: Datastore, recorder: Recorder) -> None:
    store.pod_delete(key("ghost"))
    assert recorder.calls == []


@pytest.mark.timeout(10)
def test_resync_makes_the_set_exact_and_keeps_metrics(store: Datastore, recorder: Recorder) -> None:
    store.pod_update_or_add(pod("stays", "10.0.0.1"))
    store.pod_update_or_add(pod("goes", "10.0.0.2"))
    metrics = Metrics(running_queue_size=1, updated_at=1.0)
    store.pod_update_metrics_if_exist(key("stays"), metrics)
    recorder.calls.clear()

    store.pod_resync([pod("stays", "10.0.0.5"), pod("new", "10.0.0.3"), unready("not-ready")])

    assert {pm.pod.key.name: pm.pod.address for pm in store.pod_get_all()} == {
        "stays": "10.0.0.5",
        "new": "10.0.0.3",
    }
    stays = store.pod_get(key("stays"))
    assert stays is not None
    assert stays.metrics == metrics
    assert recorder.calls == [("removed", "goes"), ("moved", "stays"), ("added", "new")]


# --- pool -------------------------------------------------------------------------------------
def test_pool_labels_match_is_false_without_a_pool(store: Datastore) -> None:
    """Upstream #696: matching against a nil pool crashed."""
    assert not store.pool_has_synced()
    assert store.pool_labels_match({"app": "vllm"}) is False
    store.pool_set(pool())
    assert store.pool_labels_match({"app": "vllm", "x": "y"}) is True
    assert store.pool_labels_match({"app": "other"}) is False


@pytest.mark.timeout(10)
def test_clear_forgets_everything_and_stops_every_refresher(store: Datastore, recorder: Recorder) -> None:
    store.pool_set(pool())
    store.model_set_if_older(model("m1", "llama"))
    for name in ("p1", "p2", "p3"):
        store.pod_update_or_add(pod(name))
    recorder.calls.clear()

    store.clear()

    assert store.pool_get() is None
    assert store.model_get_all() == ()
    assert store.pod_get_all() == ()
    assert sorted(recorder.calls) == [("removed", "p1"), ("removed", "p2"), ("removed", "p3")]


def test_a_failing_listener_does_not_skip_the_other_pods() -> None:
    removed: list[str] = []

    class Flaky:
        def pod_added(self, key: NamespacedName, store: Datastore) -> None:
            pass

        def pod_removed(self, key: NamespacedName) -> None:
            removed.append(key.name)
            raise RuntimeError("refresher already gone")

    store = new_datastore(Flaky())
    for name in ("p1", "p2"):
        store.pod_update_or_add(pod(name))
    store.clear()
    assert sorted(removed) == ["p1", "p2"]


def test_store_without_listener(store: Datastore) -> None:
    bare = new_datastore()
    assert bare.pod_update_or_add(pod("p1")) is True
    bare.clear()
    assert bare.pod_get_all() == ()


# --- models -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("first", "second", "winner"),
    [
        pytest.param(
            model("a", "llama", 0), model("a", "llama", 0, "Critical"), "a", id="same-object-overwrites"
        ),
        pytest.param(model("old", "llama", 0), model("new", "llama", 10), "old", id="newer-rejected"),
        pytest.param(model("new", "llama", 10), model("old", "llama", 0), "old", id="strictly-older-wins"),
        pytest.param(model("a", "llama", 5), model("b", "llama", 5), "a", id="tie-first-name-keeps-it"),
        pytest.param(model("b", "llama", 5), model("a", "llama", 5), "a", id="tie-first-name-takes-over"),
    ],
)
def test_model_set_if_older(
    store: Datastore, first: InferenceModel, second: InferenceModel, winner: str
) -> None:
    assert store.model_set_if_older(first)
    accepted = store.model_set_if_older(second)
    stored = store.model_get("llama")
    assert stored is not None
    assert stored.key.name == winner
    assert accepted is (winner == second.key.name)
    assert stored == (second if accepted else first)


def test_model_delete_is_by_identity(store: Datastore) -> None:
    store.model_set_if_older(model("owner", "llama", 0))
    store.model_set_if_older(model("loser", "llama", 10))  # rejected
    store.model_set_if_older(model("m2", "mistral", 0))

    assert store.model_delete(key("loser")) is None
    removed = store.model_delete(key("owner"))

    assert removed is not None
    assert removed.key == key("owner")
    assert store.model_get("llama") is None
    assert [m.key.name for m in store.model_get_all()] == ["m2"]


def test_renamed_model_does_not_linger_under_its_old_name(store: Datastore) -> None:
    store.model_set_if_older(model("m1", "llama"))
    store.model_set_if_older(model("m1", "llama-v2"))
    assert store.model_get("llama") is None
    stored = store.model_get("llama-v2")
    assert stored is not None
    assert stored.key == key("m1")


# --- snapshots --------------------------------------------------------------------------------
def test_reads_are_immutable_snapshots(store: Datastore) -> None:
    store.pod_update_or_add(pod("p1"))
    snapshot = store.pod_get_all()
    assert isinstance(snapshot, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot[0].pod.address = "6.6.6.6"
    store.pod_update_or_add(pod("p2"))
    assert len(snapshot) == 1
    assert isinstance(store.model_get_all(), tuple)
