"""The datastore implementation behind the `Datastore` Protocol (epp-behaviour.md §2, DESIGN.md §1, §2)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from epp.api import EndpointKey, ModelRewrite, NamespacedName, PodObject, v1, v1alpha2
from epp.api.types import InferencePool
from epp.datastore import Datastore, Metrics, new_datastore
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder
from tests.unit.api import objects

NS = "ns1"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def pod(name: str, ip: str = "10.0.0.1") -> PodObject:
    return PodObject.from_api(PodBuilder(name).namespace(NS).labels(app="vllm").ready(ip, at=T0).build())


def unready(name: str, ip: str = "10.0.0.1") -> PodObject:
    return PodObject.from_api(PodBuilder(name).namespace(NS).labels(app="vllm").unready(ip, at=T0).build())


def pool(port: int = 8000) -> InferencePool:
    built = PoolBuilder("pool").namespace(NS).selector(app="vllm").port(port).extension_ref("epp").build()
    return v1alpha2.pool_from_api(built)


def pool_v1(*ports: int) -> InferencePool:
    return v1.pool_from_api(objects.pool_v1(ns=NS, ports=ports))


def model(name: str, model_name: str, age_s: int = 0, criticality: str = "Standard") -> ModelRewrite:
    built = (
        ModelBuilder(name)
        .namespace(NS)
        .model_name(model_name)
        .pool("pool")
        .criticality(criticality)
        .created_at(T0 + timedelta(seconds=age_s))
        .build()
    )
    return v1alpha2.model_from_api(built)


def key(name: str, rank: int = 0) -> EndpointKey:
    return EndpointKey(NS, name, rank)


def pod_key(name: str) -> NamespacedName:
    return NamespacedName(NS, name)


class Recorder:
    """A PodLifecycleListener that also proves calls happen outside the lock by reading the store."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (what, str(endpoint key) without the namespace)
        self.seen_by_add: list[bool] = []
        self.moved_to: list[str] = []
        self.store: Datastore | None = None

    def pod_added(self, key: EndpointKey, store: Datastore) -> None:
        self.calls.append(("added", _short(key)))
        # Would deadlock (threading.Lock is not re-entrant) if called under the store's lock.
        self.seen_by_add.append(store.pod_get(key) is not None)
        self.store = store

    def pod_removed(self, key: EndpointKey) -> None:
        self.calls.append(("removed", _short(key)))
        assert self.store is not None
        assert self.store.pod_get(key) is None

    def pod_moved(self, key: EndpointKey, store: Datastore) -> None:
        self.calls.append(("moved", _short(key)))
        stored = store.pod_get(key)  # outside the lock, and already at the new address
        assert stored is not None
        self.moved_to.append(stored.pod.address)


def _short(key: EndpointKey) -> str:
    return key.name if key.rank == 0 else f"{key.name}#{key.rank}"


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def store(recorder: Recorder) -> Datastore:
    """A store whose pool (one target port) is known: pods are held only while it is."""
    store = new_datastore(recorder)
    store.pool_set(pool())
    return store


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
    store.pod_delete(pod_key("p1"))
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
    store.pod_delete(pod_key("p1"))
    assert not store.pod_update_metrics_if_exist(key("p1"), Metrics(updated_at=2.0))
    assert store.pod_get(key("p1")) is None
    assert recorder.calls == [("added", "p1"), ("removed", "p1")]


def test_delete_of_absent_pod_tells_nobody(store: Datastore, recorder: Recorder) -> None:
    store.pod_delete(pod_key("ghost"))
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


def test_a_resync_that_drops_several_pods_tells_the_listener_of_each(
    store: Datastore, recorder: Recorder
) -> None:
    """Every endpoint a resync drops is reported (its prober refresher stops), not only the last."""
    for name, ip in (("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")):
        store.pod_update_or_add(pod(name, ip))
    recorder.calls.clear()

    store.pod_resync([pod("c", "10.0.0.3")])

    assert sorted(recorder.calls) == [("removed", "a"), ("removed", "b")]


def test_a_pod_that_comes_back_starts_with_no_requests_in_flight(store: Datastore) -> None:
    """A deleted pod's in-flight counts go with it: the same name re-added is a new endpoint."""
    store.pod_update_or_add(pod("p1"))
    assert store.pod_dispatch_started(key("p1"), "m")
    store.pod_delete(pod_key("p1"))
    store.pod_update_or_add(pod("p1"))
    assert store.pod_dispatch_started(key("p1"), "m")

    back = store.pod_get(key("p1"))
    assert back is not None
    assert back.dispatched.count == 1


# --- pool -------------------------------------------------------------------------------------
def test_pool_labels_match_is_false_without_a_pool() -> None:
    """Upstream #696: matching against a nil pool crashed."""
    store = new_datastore()
    assert not store.pool_has_synced()
    assert store.pool_labels_match({"app": "vllm"}) is False
    store.pool_set(pool())
    assert store.pool_labels_match({"app": "vllm", "x": "y"}) is True
    assert store.pool_labels_match({"app": "other"}) is False


@pytest.mark.timeout(10)
def test_clear_forgets_everything_and_stops_every_refresher(store: Datastore, recorder: Recorder) -> None:
    store.pool_set(pool())
    store.rewrite_set(model("m1", "llama"))
    for name in ("p1", "p2", "p3"):
        store.pod_update_or_add(pod(name))
    recorder.calls.clear()

    store.clear()

    assert store.pool_get() is None
    assert store.rewrite_get_all() == ()
    assert store.objective_get_all() == ()
    assert store.pod_get_all() == ()
    assert sorted(recorder.calls) == [("removed", "p1"), ("removed", "p2"), ("removed", "p3")]


def test_a_failing_listener_does_not_skip_the_other_pods(caplog: pytest.LogCaptureFixture) -> None:
    """Each failure is logged with the endpoint it was for and its traceback, and the others go on."""
    removed: list[str] = []

    class Flaky:
        def pod_added(self, key: EndpointKey, store: Datastore) -> None:
            pass

        def pod_removed(self, key: EndpointKey) -> None:
            removed.append(key.name)
            raise RuntimeError("refresher already gone")

    store = new_datastore(Flaky())
    store.pool_set(pool())
    for name in ("p1", "p2"):
        store.pod_update_or_add(pod(name))
    keys = sorted(str(p.pod.key) for p in store.pod_get_all())
    with caplog.at_level("ERROR", logger="epp.datastore"):
        store.clear()
    assert sorted(removed) == ["p1", "p2"]
    failures = sorted(
        (r.getMessage(), r.exc_info is not None) for r in caplog.records if r.name.startswith("epp.datastore")
    )
    assert failures == [(f"pod lifecycle listener failed for {key}", True) for key in keys]


def test_store_without_listener(store: Datastore) -> None:
    bare = new_datastore()
    assert bare.pod_update_or_add(pod("p1")) is False  # no pool: no endpoints to make
    assert bare.pod_get_all() == ()
    bare.pool_set(pool())
    assert bare.pod_update_or_add(pod("p1")) is True
    bare.clear()
    assert bare.pod_get_all() == ()


# --- rewrites (v1alpha2 InferenceModels converted) --------------------------------------------
@pytest.mark.parametrize(
    ("first", "second", "winner"),
    [
        pytest.param(
            model("a", "llama", 0), model("a", "llama", 0, "Critical"), "a", id="same-object-overwrites"
        ),
        pytest.param(model("old", "llama", 0), model("new", "llama", 10), "old", id="newer-loses"),
        pytest.param(model("new", "llama", 10), model("old", "llama", 0), "old", id="strictly-older-wins"),
        pytest.param(model("a", "llama", 5), model("b", "llama", 5), "a", id="tie-first-name-keeps-it"),
        pytest.param(model("b", "llama", 5), model("a", "llama", 5), "a", id="tie-first-name-takes-over"),
    ],
)
def test_oldest_model_owns_its_name(
    store: Datastore, first: ModelRewrite, second: ModelRewrite, winner: str
) -> None:
    store.rewrite_set(first)
    store.rewrite_set(second)
    match = store.rewrite_match("llama")
    assert match is not None
    assert match.rewrite.key.name == winner
    assert match.rewrite == (second if winner == second.key.name else first)


def test_rewrite_delete_is_by_identity_and_hands_the_name_on(store: Datastore) -> None:
    store.rewrite_set(model("owner", "llama", 0))
    store.rewrite_set(model("next", "llama", 10))
    store.rewrite_set(model("m2", "mistral", 0))

    assert store.rewrite_delete(pod_key("ghost")) is None
    removed = store.rewrite_delete(pod_key("owner"))

    assert removed is not None
    assert removed.key == pod_key("owner")
    match = store.rewrite_match("llama")
    assert match is not None
    assert match.rewrite.key == pod_key("next")
    store.rewrite_delete(pod_key("next"))
    assert store.rewrite_match("llama") is None
    assert {n: m.rewrite.key.name for n, m in store.rewrite_get_exact().items()} == {"mistral": "m2"}


def test_renamed_model_does_not_linger_under_its_old_name(store: Datastore) -> None:
    store.rewrite_set(model("m1", "llama"))
    store.rewrite_set(model("m1", "llama-v2"))
    assert store.rewrite_match("llama") is None
    stored = store.rewrite_match("llama-v2")
    assert stored is not None
    assert stored.rewrite.key == pod_key("m1")


# --- rewrite precedence (v1 InferenceModelRewrite) ---------------------------------------------
def _rw(name: str, *rules: dict[str, object], age_s: int = 0) -> ModelRewrite:
    return v1.rewrite_from_api(objects.rewrite(name, *rules, ns=NS, age_s=age_s))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rewrites", "model_name", "expected"),
    [
        pytest.param([_rw("a", objects.rule("llama", targets=[("x", 1)]))], "llama", ("a", "x"), id="exact"),
        pytest.param([_rw("a", objects.rule("llama", targets=[("x", 1)]))], "other", None, id="no-match"),
        pytest.param([_rw("a", objects.rule(targets=[("x", 1)]))], "anything", ("a", "x"), id="catch-all"),
        pytest.param(
            [
                _rw("old-catch-all", objects.rule(targets=[("any", 1)]), age_s=0),
                _rw("young-exact", objects.rule("llama", targets=[("exact", 1)]), age_s=100),
            ],
            "llama",
            ("young-exact", "exact"),
            id="exact-beats-older-catch-all",
        ),
        pytest.param(
            [
                _rw("old-catch-all", objects.rule(targets=[("any", 1)]), age_s=0),
                _rw("young-exact", objects.rule("llama", targets=[("exact", 1)]), age_s=100),
            ],
            "mistral",
            ("old-catch-all", "any"),
            id="catch-all-takes-the-rest",
        ),
        pytest.param(
            [
                _rw("young", objects.rule("llama", targets=[("young", 1)]), age_s=10),
                _rw("old", objects.rule("llama", targets=[("old", 1)]), age_s=0),
            ],
            "llama",
            ("old", "old"),
            id="oldest-exact-wins",
        ),
        pytest.param(
            [
                _rw("young", objects.rule(targets=[("young", 1)]), age_s=10),
                _rw("old", objects.rule(targets=[("old", 1)]), age_s=0),
            ],
            "llama",
            ("old", "old"),
            id="oldest-catch-all-wins",
        ),
        pytest.param(
            [
                _rw("b", objects.rule("llama", targets=[("b", 1)]), age_s=5),
                _rw("a", objects.rule("llama", targets=[("a", 1)]), age_s=5),
            ],
            "llama",
            ("a", "a"),
            id="same-second-first-name-wins",
        ),
        pytest.param(
            [
                _rw(
                    "one",
                    objects.rule("llama", targets=[("first", 1)]),
                    objects.rule("llama", "mistral", targets=[("second", 1)]),
                )
            ],
            "llama",
            ("one", "first"),
            id="first-rule-in-list-order",
        ),
        pytest.param(
            [
                _rw(
                    "one",
                    objects.rule(targets=[("catch", 1)]),
                    objects.rule("llama", targets=[("exact", 1)]),
                )
            ],
            "llama",
            ("one", "exact"),
            id="exact-rule-beats-an-earlier-catch-all-rule",
        ),
        pytest.param(
            [_rw("one", objects.rule("llama", "mistral", targets=[("both", 1)]))],
            "mistral",
            ("one", "both"),
            id="any-of-several-matches",
        ),
    ],
)
def test_rewrite_precedence(
    store: Datastore, rewrites: Sequence[ModelRewrite], model_name: str, expected: tuple[str, str] | None
) -> None:
    """Exact > catch-all > oldest creationTimestamp (then namespace/name) > rule order (upstream-v1.md §a).

    A match says whether it matched by name: only then is the request's model a declared one (its
    metrics carry the name; a catch-all's carry the unknown-model label).
    """
    for rewrite in rewrites:
        store.rewrite_set(rewrite)
    match = store.rewrite_match(model_name)
    got = None if match is None else (match.rewrite.key.name, match.rule.targets[0].name)
    assert got == expected
    if match is not None:
        assert match.exact is (model_name in match.rule.models)


# --- objectives -------------------------------------------------------------------------------
def test_objectives_are_found_by_name_in_the_pool_namespace(store: Datastore) -> None:
    store.objective_set(v1.objective_from_api(objects.objective("chat", 5, ns=NS)))
    store.objective_set(v1.objective_from_api(objects.objective("batch", ns="elsewhere")))
    chat = store.objective_get("chat")
    assert chat is not None
    assert chat.effective_priority == 5
    assert store.objective_get("batch") is None
    assert store.objective_delete(pod_key("chat")) is not None
    assert store.objective_get("chat") is None


# --- endpoints: one per pod and target port ----------------------------------------------------
def test_a_pod_has_one_endpoint_per_target_port(recorder: Recorder) -> None:
    store = new_datastore(recorder)
    store.pool_set(pool_v1(8000, 8001, 8002))
    store.pod_update_or_add(pod("p1", "10.0.0.1"))
    assert sorted((e.pod.key.rank, e.pod.endpoint) for e in store.pod_get_all()) == [
        (0, "10.0.0.1:8000"),
        (1, "10.0.0.1:8001"),
        (2, "10.0.0.1:8002"),
    ]
    assert recorder.calls == [("added", "p1"), ("added", "p1#1"), ("added", "p1#2")]
    # Each rank has metrics of its own.
    assert store.pod_update_metrics_if_exist(key("p1", 1), Metrics(waiting_queue_size=4, updated_at=1.0))
    assert [e.metrics.waiting_queue_size for e in sorted(store.pod_get_all(), key=lambda e: e.pod.key)] == [
        0,
        4,
        0,
    ]
    store.pod_delete(pod_key("p1"))
    assert store.pod_get_all() == ()
    assert sorted(recorder.calls[3:]) == [("removed", "p1"), ("removed", "p1#1"), ("removed", "p1#2")]


@pytest.mark.parametrize(
    ("before", "after", "endpoints", "calls"),
    [
        pytest.param(
            (8000, 8001),
            (8000,),
            ["p1@8000", "p2@8000"],
            [("removed", "p1#1"), ("removed", "p2#1")],
            id="shrink",
        ),
        pytest.param(
            (8000,),
            (8000, 8001),
            ["p1@8000", "p1@8001", "p2@8000", "p2@8001"],
            [("added", "p1#1"), ("added", "p2#1")],
            id="grow",
        ),
        pytest.param(
            (8000, 8001),
            (9000, 8001),
            ["p1@8001", "p1@9000", "p2@8001", "p2@9000"],
            [("moved", "p1"), ("moved", "p2")],
            id="renumber-one",
        ),
        pytest.param(
            (8000, 8001), (8000, 8001), ["p1@8000", "p1@8001", "p2@8000", "p2@8001"], [], id="unchanged"
        ),
        pytest.param(
            (8000, 8001, 8002),
            (8001,),
            ["p1@8001", "p2@8001"],
            [
                ("moved", "p1"),
                ("removed", "p1#1"),
                ("removed", "p1#2"),
                ("moved", "p2"),
                ("removed", "p2#1"),
                ("removed", "p2#2"),
            ],
            id="shrink-and-renumber",
        ),
    ],
)
def test_target_ports_change_applies_to_every_pod_at_once(
    recorder: Recorder,
    before: tuple[int, ...],
    after: tuple[int, ...],
    endpoints: list[str],
    calls: list[tuple[str, str]],
) -> None:
    """Upstream #2306: after a shrink, stale rank endpoints stayed routable. Here the pool's ports
    decide the endpoints the moment the pool is set; rank 0 keeps its metrics throughout."""
    store = new_datastore(recorder)
    store.pool_set(pool_v1(*before))
    for name, ip in (("p1", "10.0.0.1"), ("p2", "10.0.0.2")):
        store.pod_update_or_add(pod(name, ip))
    metrics = Metrics(waiting_queue_size=3, updated_at=1.0)
    store.pod_update_metrics_if_exist(key("p1"), metrics)
    store.pod_dispatch_started(key("p1", len(before) - 1), "m")
    recorder.calls.clear()

    store.pool_set(pool_v1(*after))

    assert sorted(f"{e.pod.key.name}@{e.pod.port}" for e in store.pod_get_all()) == endpoints
    assert recorder.calls == calls
    rank0 = store.pod_get(key("p1"))
    assert rank0 is not None
    assert rank0.metrics == metrics
    last = store.pod_get(key("p1", len(before) - 1))
    if len(after) < len(before):
        assert last is None
        # A rank that comes back is a new endpoint: the old rank's requests are not its own.
        store.pool_set(pool_v1(*before))
        back = store.pod_get(key("p1", len(before) - 1))
        assert back is not None
        assert back.dispatched.count == 0


@pytest.mark.parametrize("gone_by", ["delete", "resync"])
def test_a_pod_that_left_is_not_brought_back_by_a_target_ports_change(gone_by: str) -> None:
    """A targetPorts change re-creates every member pod's endpoints: a pod deleted (or dropped by a
    resync) before it must stay gone, not come back routable at an address nobody serves."""
    store = new_datastore(None)
    store.pool_set(pool_v1(8000))
    store.pod_update_or_add(pod("p1", "10.0.0.1"))
    store.pod_update_or_add(pod("p2", "10.0.0.2"))
    if gone_by == "delete":
        store.pod_delete(pod_key("p1"))
    else:
        store.pod_resync([pod("p2", "10.0.0.2")])

    store.pool_set(pool_v1(8000, 8001))

    assert sorted(f"{e.pod.key.name}@{e.pod.port}" for e in store.pod_get_all()) == ["p2@8000", "p2@8001"]


def test_a_scrape_of_an_old_port_is_not_written(store: Datastore) -> None:
    store.pod_update_or_add(pod("p1", "10.0.0.1"))
    store.pool_set(pool(9000))
    assert not store.pod_update_metrics_if_exist(key("p1"), Metrics(updated_at=1.0), "10.0.0.1", 8000)
    assert store.pod_update_metrics_if_exist(key("p1"), Metrics(updated_at=2.0), "10.0.0.1", 9000)


# --- snapshots --------------------------------------------------------------------------------
def test_reads_are_immutable_snapshots(store: Datastore) -> None:
    store.pod_update_or_add(pod("p1"))
    snapshot = store.pod_get_all()
    assert isinstance(snapshot, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot[0].pod.address = "6.6.6.6"
    store.pod_update_or_add(pod("p2"))
    assert len(snapshot) == 1
    assert isinstance(store.rewrite_get_all(), tuple)
    assert isinstance(store.objective_get_all(), tuple)


def test_endpoints_carry_the_pod_labels_the_prober_picks_the_engine_by(store: Datastore) -> None:
    labelled = dataclasses.replace(
        pod("p1", "10.0.0.1"), labels={"app": "vllm", "inference.networking.k8s.io/engine-type": "sglang"}
    )
    store.pod_update_or_add(labelled)
    stored = store.pod_get(key("p1"))
    assert stored is not None
    assert stored.pod.label("inference.networking.k8s.io/engine-type") == "sglang"
    assert stored.pod.label("absent") == ""
