"""Pure request-side rules: body parsing, the weighted draw, the rewrite format."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from epp.api.types import InferenceModel, NamespacedName, TargetModel
from epp.errors import BadRequest, ModelNotFound
from epp.handlers.request import ParsedBody, not_found, parse_body, pick_target, rewrite_model


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(b"{", "invalid JSON request body: Expecting property name", id="truncated"),
        pytest.param(b"", "invalid JSON request body: Expecting value", id="empty"),
        pytest.param(b'"model"', "invalid JSON request body: expected an object, got str", id="string"),
        pytest.param(b"null", "invalid JSON request body: expected an object, got NoneType", id="null"),
        pytest.param(b'{"model": NaN}', "invalid JSON request body: NaN is not valid JSON", id="nan"),
        pytest.param(b"\xff\xfe\x00", "invalid JSON request body: ", id="bad-encoding"),
        pytest.param(b"[" * 100_000, "invalid JSON request body: ", id="too-deep"),
        pytest.param(b"{}", 'missing or non-string "model" in request body', id="no-model"),
        pytest.param(b'{"model": null}', 'missing or non-string "model" in request body', id="null-model"),
        pytest.param(b'{"model": ["a"]}', 'missing or non-string "model" in request body', id="list-model"),
    ],
)
def test_bad_bodies_are_400_with_one_line(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_body(raw)
    assert info.value.http_status == 400
    assert info.value.message.startswith(message)
    assert "\n" not in info.value.message


def test_good_body_keeps_every_field() -> None:
    parsed = parse_body(b'{"model": "m", "prompt": "p", "n": 12345678901234567890}')
    assert parsed.model == "m"
    assert parsed.fields["n"] == 12345678901234567890


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


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"model": "m", "prompt": "hi"}, b'{"model":"t","prompt":"hi"}', id="compact"),
        pytest.param({"prompt": "hi", "model": "m"}, b'{"prompt":"hi","model":"t"}', id="order-kept"),
        pytest.param({"model": "m", "p": "é<>&"}, '{"model":"t","p":"é<>&"}'.encode(), id="raw-utf8"),
        pytest.param({"model": "m", "n": 2**70, "f": 0.1},
                     b'{"model":"t","n":1180591620717411303424,"f":0.1}', id="numbers-exact"),
        pytest.param({"model": "m", "p": "\ud800"}, b'{"model":"t","p":"\\ud800"}', id="lone-surrogate"),
    ],
)  # fmt: skip
def test_rewrite_format(fields: dict[str, object], expected: bytes) -> None:
    out = rewrite_model(ParsedBody(dict(fields), "m"), "t")
    assert out == expected
    assert json.loads(out)["model"] == "t"
