"""Metric-spec flags (epp-behaviour.md §4.4): the grammar, every error case, label matching."""

from __future__ import annotations

import pytest

from epp.backend.metrics.parse import compile_metric_names
from epp.backend.metrics.spec import MetricSpec, parse_metric_spec
from epp.config import MetricNames


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("vllm:num_requests_waiting", MetricSpec("vllm:num_requests_waiting"), id="plain-name"),
        pytest.param("  vllm:x \t", MetricSpec("vllm:x"), id="whitespace-trimmed"),
        pytest.param("m{a=b}", MetricSpec("m", (("a", "b"),)), id="one-label"),
        pytest.param("m{a=b,c=d}", MetricSpec("m", (("a", "b"), ("c", "d"))), id="two-labels"),
        pytest.param(" m { a = b , c = d } ", MetricSpec("m", (("a", "b"), ("c", "d"))), id="spaces-inside"),
        pytest.param('m{a="b c"}', MetricSpec("m", (("a", "b c"),)), id="quoted-value"),
        pytest.param("", None, id="empty-disables"),
        pytest.param("   ", None, id="blank-disables"),
    ],
)
def test_valid_specs(text: str, expected: MetricSpec | None) -> None:
    assert parse_metric_spec(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("m{a=b", "unbalanced braces", id="missing-close-brace"),
        pytest.param("ma=b}", "unbalanced braces", id="missing-open-brace"),
        pytest.param("m}a=b{", "unbalanced braces", id="braces-reversed"),
        pytest.param("m{}", "empty label block", id="empty-braces"),
        pytest.param("m{  }", "empty label block", id="blank-braces"),
        pytest.param("m{a=b}x", "unexpected text after", id="text-after-brace"),
        pytest.param("m{a=b}{c=d}", "more than one label block", id="two-label-blocks"),
        pytest.param("m{a}", "is not key=value", id="pair-without-equals"),
        pytest.param("m{a=b=c}", "is not key=value", id="pair-with-two-equals"),
        pytest.param("m{=b}", "empty key or value", id="empty-key"),
        pytest.param("m{a=}", "empty key or value", id="empty-value"),
        pytest.param('m{a=""}', "empty key or value", id="empty-quoted-value"),
        pytest.param("m{a=b,}", "is not key=value", id="trailing-comma"),
        pytest.param("m{a=b,a=c}", "listed twice", id="duplicate-label"),
        pytest.param("{a=b}", "empty metric name", id="empty-name-with-labels"),
        pytest.param("my metric", "not a valid metric name", id="space-in-name"),
        pytest.param("9lives", "not a valid metric name", id="name-starts-with-digit"),
        pytest.param("m{a-b=c}", "not a valid label name", id="bad-label-name"),
    ],
)
def test_invalid_specs(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as info:
        parse_metric_spec(text)
    assert repr(text) in str(info.value), "the message quotes the offending flag value"


@pytest.mark.parametrize(
    ("spec", "labels", "matches"),
    [
        pytest.param("m", {}, True, id="no-labels-listed-matches-anything"),
        pytest.param("m", {"x": "y"}, True, id="no-labels-listed-extra-labels"),
        pytest.param("m{a=b}", {"a": "b"}, True, id="exact"),
        pytest.param("m{a=b}", {"a": "b", "z": "1"}, True, id="extra-labels-ok"),
        pytest.param("m{a=b}", {"a": "c"}, False, id="wrong-value"),
        pytest.param("m{a=b}", {}, False, id="label-missing"),
        pytest.param("m{a=b,c=d}", {"a": "b"}, False, id="one-of-two-missing"),
        pytest.param("m{a=b,c=d}", {"c": "d", "a": "b"}, True, id="all-present-any-order"),
    ],
)
def test_label_matching(spec: str, labels: dict[str, str], matches: bool) -> None:
    parsed = parse_metric_spec(spec)
    assert parsed is not None
    assert parsed.matches(labels) is matches


def test_compile_names_reports_the_field() -> None:
    with pytest.raises(ValueError, match=r"^lora_info: invalid metric spec"):
        compile_metric_names(MetricNames(lora_info="x{"))


def test_compile_names_disabled_field_is_none() -> None:
    plan = compile_metric_names(MetricNames(running_requests=""))
    assert plan.running_requests is None
    assert plan.queued_requests == MetricSpec("vllm:num_requests_waiting")
