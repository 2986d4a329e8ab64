"""Pure request-side rules: the not-found message, the weighted draw, and `resolve` (which target,
which priority) over the one datastore shape of both API generations (bodies: tests/unit/body)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from epp.api import v1, v1alpha2
from epp.api.types import RewriteRule, TargetModel
from epp.datastore import Datastore, new_datastore
from epp.errors import ModelNotFound
from epp.handlers.request import MODEL_REWRITE_HEADER, OBJECTIVE_HEADER, not_found, pick_target, resolve
from harness.cluster.builders import ModelBuilder, PoolBuilder
from tests.unit.api import objects


def test_not_found_message() -> None:
    err = not_found("llama\r\n3")
    assert (err.http_status, err.message) == (404, "model llama 3 not found")


def _model(*targets: TargetModel) -> RewriteRule:
    return RewriteRule(("base",), targets)


class _FixedDraw(random.Random):
    """randrange returns the scripted value, so each branch of the walk is hit exactly."""

    def __init__(self, value: int) -> None:
        super().__init__(0)
        self.value = value
        self.ranges: list[int] = []

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        self.ranges.append(start)
        return self.value


@pytest.mark.parametrize(
    ("draw", "expected"),
    [
        pytest.param(0, "a", id="first-slot"),
        pytest.param(19, "a", id="last-of-first"),
        pytest.param(20, "c", id="zero-weight-skipped"),
        pytest.param(99, "c", id="last-slot"),
    ],
)
def test_weighted_draw_walks_the_weights(draw: int, expected: str) -> None:
    rng = _FixedDraw(draw)
    model = _model(TargetModel("a", 20), TargetModel("b", 0), TargetModel("c", 80))
    assert pick_target(model, "base", rng) == expected
    assert rng.ranges == [100]


def test_no_targets_is_direct_passthrough() -> None:
    assert pick_target(_model(), "base", random.Random(1)) == "base"


def test_no_weights_is_uniform() -> None:
    rng = random.Random(42)
    model = _model(TargetModel("a"), TargetModel("b"), TargetModel("c"))
    counts = Counter(pick_target(model, "base", rng) for _ in range(3000))
    assert set(counts) == {"a", "b", "c"}
    assert all(800 < n < 1200 for n in counts.values()), counts


def test_weights_summing_to_zero_is_404() -> None:
    with pytest.raises(ModelNotFound, match=r"^model base has no target model with a positive weight$"):
        pick_target(_model(TargetModel("a", 0)), "base", random.Random(1))


def test_a_model_name_in_a_message_is_cut_at_256_characters() -> None:
    name = "m" * 255 + "XY"
    assert str(not_found(name)) == f"model {name[:256]} not found"
    with pytest.raises(ModelNotFound) as raised:
        pick_target(_model(TargetModel("a", 0)), name, random.Random(1))
    assert str(raised.value) == f"model {name[:256]} has no target model with a positive weight"


# --- resolve: one shape, either generation ----------------------------------------------------
NS = "ns1"


def v1alpha2_store() -> Datastore:
    """InferenceModels `chat` (Critical, to chat-lora), `batch` (Sheddable), `plain` (no criticality)."""
    store = new_datastore()
    store.pool_set(
        v1alpha2.pool_from_api(PoolBuilder("pool").namespace(NS).selector(app="x").port(8000).build())
    )
    for name, crit, targets in (
        ("chat", "Critical", ["chat-lora"]),
        ("batch", "Sheddable", []),
        ("plain", "", []),
    ):
        builder = ModelBuilder(name).namespace(NS).model_name(name).pool("pool")
        if crit:
            builder = builder.criticality(crit)
        for t in targets:
            builder = builder.target(t, weight=1)
        store.rewrite_set(v1alpha2.model_from_api(builder.build()))
    return store


def v1_store() -> Datastore:
    """Objectives `premium` (10), `bulk` (-5), `plain` (unset); rewrite `chat` -> chat-v2, catch-all none."""
    store = new_datastore()
    store.pool_set(v1.pool_from_api(objects.pool_v1(ns=NS)))
    for name, priority in (("premium", 10), ("bulk", -5), ("plain", None)):
        store.objective_set(v1.objective_from_api(objects.objective(name, priority, ns=NS)))
    store.rewrite_set(
        v1.rewrite_from_api(objects.rewrite("r", objects.rule("chat", targets=[("chat-v2", 1)]), ns=NS))
    )
    return store


@pytest.mark.parametrize(
    ("make", "model", "headers", "expected"),
    [
        # v1alpha2: the InferenceModel decides target and priority; criticality maps onto priority.
        pytest.param(v1alpha2_store, "chat", {}, ("chat-lora", 1, True, True), id="v1alpha2-critical"),
        pytest.param(v1alpha2_store, "batch", {}, ("batch", -2, True, True), id="v1alpha2-sheddable"),
        pytest.param(
            v1alpha2_store, "plain", {}, ("plain", -1, True, True), id="v1alpha2-unset-is-sheddable"
        ),
        pytest.param(
            v1alpha2_store,
            "chat",
            {MODEL_REWRITE_HEADER: "other"},
            ("other", 1, True, False),
            id="v1alpha2-header-rewrite-overrides",
        ),
        # v1: any model passes; the objective header decides the priority.
        pytest.param(v1_store, "chat", {}, ("chat-v2", 0, True, True), id="v1-rewritten-default-priority"),
        pytest.param(v1_store, "llama", {}, ("llama", 0, False, False), id="v1-unmatched-passes-unchanged"),
        pytest.param(
            v1_store, "llama", {OBJECTIVE_HEADER: "premium"}, ("llama", 10, False, False), id="v1-objective"
        ),
        pytest.param(
            v1_store,
            "chat",
            {OBJECTIVE_HEADER: "bulk"},
            ("chat-v2", -5, True, True),
            id="v1-negative-sheddable",
        ),
        pytest.param(
            v1_store,
            "chat",
            {OBJECTIVE_HEADER: "plain"},
            ("chat-v2", 0, True, True),
            id="v1-unset-priority-0",
        ),
        pytest.param(
            v1_store,
            "chat",
            {OBJECTIVE_HEADER: "nope"},
            ("chat-v2", 0, True, True),
            id="v1-unknown-objective-0",
        ),
        pytest.param(
            v1_store,
            "chat",
            {MODEL_REWRITE_HEADER: "forced", OBJECTIVE_HEADER: "premium"},
            ("forced", 10, True, False),
            id="v1-header-rewrite-overrides-the-rule",
        ),
        pytest.param(
            v1_store,
            "chat",
            {MODEL_REWRITE_HEADER: ""},
            ("chat-v2", 0, True, True),
            id="v1-empty-header-ignored",
        ),
    ],
)
def test_resolve(
    make: Callable[[], Datastore], model: str, headers: dict[str, str], expected: tuple[str, int, bool, bool]
) -> None:
    store = make()
    pool = store.pool_get()
    assert pool is not None
    got = resolve(pool, store, model, headers, random.Random(1))
    assert (got.target, got.priority, got.model_declared, got.target_declared) == expected
    assert got.sheddable is (expected[1] < 0)


def test_v1alpha2_unknown_model_is_404_and_v1_is_not() -> None:
    old, new = v1alpha2_store(), v1_store()
    old_pool, new_pool = old.pool_get(), new.pool_get()
    assert old_pool is not None
    assert new_pool is not None
    with pytest.raises(ModelNotFound, match="model llama not found"):
        resolve(old_pool, old, "llama", {}, random.Random(1))
    assert resolve(new_pool, new, "llama", {}, random.Random(1)).target == "llama"


def test_catch_all_rewrite_routes_every_model_and_its_weights_split() -> None:
    store = v1_store()
    store.rewrite_set(
        v1.rewrite_from_api(
            objects.rewrite("any", objects.rule(targets=[("a", 1), ("b", 3)]), ns=NS, age_s=50)
        )
    )
    pool = store.pool_get()
    assert pool is not None
    rng = random.Random(3)
    counts = Counter(resolve(pool, store, "whatever", {}, rng).target for _ in range(4000))
    assert set(counts) == {"a", "b"}
    assert 2.5 < counts["b"] / counts["a"] < 3.5, counts
    # The exact rule still wins its model over the (younger) catch-all.
    assert resolve(pool, store, "chat", {}, rng).target == "chat-v2"
