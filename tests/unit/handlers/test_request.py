"""Pure request-side rules: the not-found message and the weighted draw (bodies: tests/unit/body)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from epp.api.types import InferenceModel, NamespacedName, TargetModel
from epp.errors import ModelNotFound
from epp.handlers.request import not_found, pick_target


def test_not_found_message() -> None:
    err = not_found("llama\r\n3")
    assert (err.http_status, err.message) == (404, "model llama 3 not found")


def _model(*targets: TargetModel) -> InferenceModel:
    return InferenceModel(NamespacedName("ns", "obj"), "base", "pool", target_models=targets)


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
    assert pick_target(model, rng) == expected
    assert rng.ranges == [100]


def test_no_targets_is_direct_passthrough() -> None:
    assert pick_target(_model(), random.Random(1)) == "base"


def test_no_weights_is_uniform() -> None:
    rng = random.Random(42)
    model = _model(TargetModel("a"), TargetModel("b"), TargetModel("c"))
    counts = Counter(pick_target(model, rng) for _ in range(3000))
    assert set(counts) == {"a", "b", "c"}
    assert all(800 < n < 1200 for n in counts.values()), counts


def test_weights_summing_to_zero_is_404() -> None:
    with pytest.raises(ModelNotFound):
        pick_target(_model(TargetModel("a", 0)), random.Random(1))
