"""Turning one /metrics page into a Metrics snapshot (epp-behaviour.md §4.1, §9 items 11 and 12)."""

from __future__ import annotations

import dataclasses

import pytest

from epp.backend.metrics.parse import compile_metric_names, parse, parse_page
from epp.config import MetricNames
from epp.datastore.types import Metrics

NOW = 1234.5
NAMES = MetricNames()

QUEUE = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="base"} 7.0
"""
RUNNING = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="base"} 3.0
"""
KV = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="base"} 0.25
"""
GPU_KV = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="base"} 0.75
"""
LORA = """\
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a1,a2",waiting_lora_adapters="a3"} 1.7e9
"""
HISTOGRAM = """\
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.5",model_name="base"} 1.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="base"} 2.0
vllm:e2e_request_latency_seconds_count{model_name="base"} 2.0
vllm:e2e_request_latency_seconds_sum{model_name="base"} 0.9
"""
FULL = HISTOGRAM + QUEUE + RUNNING + KV + LORA

PREVIOUS = Metrics(
    waiting_queue_size=1,
    running_queue_size=1,
    kv_cache_usage=0.5,
    active_models=frozenset({"old"}),
    waiting_models=frozenset({"old-waiting"}),
    max_active_models=2,
    updated_at=1.0,
)


def lora_line(labels: str, value: str = "1.0") -> str:
    return f"vllm:lora_requests_info{{{labels}}} {value}\n"


def test_full_page() -> None:
    metrics, errors = parse(FULL, NAMES, Metrics(), NOW)
    assert errors == []
    assert metrics == Metrics(
        waiting_queue_size=7,
        running_queue_size=3,
        kv_cache_usage=0.25,
        active_models=frozenset({"a1", "a2"}),
        waiting_models=frozenset({"a3"}),
        max_active_models=4,
        updated_at=NOW,
    )


def test_missing_lora_family_still_updates_queue_and_kv() -> None:
    """#495/#561: vLLM v1 without LoRA has no lora_requests_info; queue and KV must still update."""
    metrics, errors = parse(QUEUE + RUNNING + KV, NAMES, PREVIOUS, NOW)
    assert errors == ['metric family "vllm:lora_requests_info" not found']
    assert (metrics.waiting_queue_size, metrics.kv_cache_usage, metrics.updated_at) == (7, 0.25, NOW)
    assert metrics.active_models == PREVIOUS.active_models
    assert metrics.max_active_models == PREVIOUS.max_active_models


@pytest.mark.parametrize(
    ("page", "missing", "kept_field"),
    [
        pytest.param(RUNNING + KV + LORA, "vllm:num_requests_waiting", "waiting_queue_size", id="no-queue"),
        pytest.param(QUEUE + KV + LORA, "vllm:num_requests_running", "running_queue_size", id="no-running"),
        pytest.param(QUEUE + RUNNING + LORA, "vllm:kv_cache_usage_perc", "kv_cache_usage", id="no-kv"),
    ],
)
def test_partial_page_keeps_previous_value_of_missing_field(page: str, missing: str, kept_field: str) -> None:
    metrics, errors = parse(page, NAMES, PREVIOUS, NOW)
    assert errors == [f'metric family "{missing}" not found']
    assert getattr(metrics, kept_field) == getattr(PREVIOUS, kept_field)
    assert metrics.active_models == frozenset({"a1", "a2"})
    assert metrics.updated_at == NOW


def test_empty_page_changes_nothing_but_the_time() -> None:
    result = parse_page("", compile_metric_names(NAMES), PREVIOUS, NOW)
    assert len(result.errors) == 4
    assert result.families_found == 0
    assert result.metrics == dataclasses.replace(PREVIOUS, updated_at=NOW)


@pytest.mark.parametrize(
    ("page", "kv"),
    [
        pytest.param(QUEUE + GPU_KV, 0.75, id="fallback-when-new-name-absent"),
        pytest.param(QUEUE + KV + GPU_KV, 0.25, id="new-name-wins-when-both"),
        pytest.param(QUEUE + GPU_KV + KV, 0.25, id="new-name-wins-regardless-of-order"),
    ],
)
def test_kv_cache_fallback(page: str, kv: float) -> None:
    metrics, errors = parse(page + RUNNING + LORA, NAMES, PREVIOUS, NOW)
    assert errors == []
    assert metrics.kv_cache_usage == kv


def test_kv_missing_under_both_names_reports_the_primary() -> None:
    _, errors = parse(QUEUE + RUNNING + LORA, NAMES, PREVIOUS, NOW)
    assert errors == ['metric family "vllm:kv_cache_usage_perc" not found']


def test_kv_fallback_disabled() -> None:
    names = MetricNames(kv_cache_usage_fallback="")
    metrics, errors = parse(QUEUE + RUNNING + GPU_KV + LORA, names, PREVIOUS, NOW)
    assert errors == ['metric family "vllm:kv_cache_usage_perc" not found']
    assert metrics.kv_cache_usage == PREVIOUS.kv_cache_usage


@pytest.mark.parametrize(
    ("lora", "active", "waiting", "max_lora"),
    [
        pytest.param(
            lora_line('max_lora="2",running_lora_adapters="old1",waiting_lora_adapters=""', "100")
            + lora_line('max_lora="3",running_lora_adapters="new1",waiting_lora_adapters="new2"', "200"),
            {"new1"},
            {"new2"},
            3,
            id="largest-value-wins-last",
        ),
        pytest.param(
            lora_line('max_lora="3",running_lora_adapters="new1",waiting_lora_adapters=""', "200")
            + lora_line('max_lora="2",running_lora_adapters="old1",waiting_lora_adapters=""', "100"),
            {"new1"},
            set(),
            3,
            id="largest-value-wins-first",
        ),
        pytest.param(
            lora_line('max_lora="3",running_lora_adapters="a",waiting_lora_adapters=""', "100")
            + lora_line('max_lora="3",running_lora_adapters="",waiting_lora_adapters=""', "300"),
            {"a"},
            set(),
            3,
            id="empty-series-skipped-even-if-newest",
        ),
        pytest.param(
            lora_line('max_lora="1",running_lora_adapters="",waiting_lora_adapters="w"'),
            set(),
            {"w"},
            1,
            id="waiting-only-series-counts",
        ),
        pytest.param(
            lora_line('max_lora="4",running_lora_adapters="a, b,,c ",waiting_lora_adapters=""'),
            {"a", "b", "c"},
            set(),
            4,
            id="adapter-names-stripped-empties-dropped",
        ),
        pytest.param(
            lora_line('running_lora_adapters="a",waiting_lora_adapters=""'),
            {"a"},
            set(),
            PREVIOUS.max_active_models,
            id="no-max-lora-label-keeps-max",
        ),
    ],
)
def test_lora_series_selection(lora: str, active: set[str], waiting: set[str], max_lora: int) -> None:
    metrics, errors = parse(QUEUE + RUNNING + KV + lora, NAMES, PREVIOUS, NOW)
    assert errors == []
    assert metrics.active_models == active
    assert metrics.waiting_models == waiting
    assert metrics.max_active_models == max_lora


def test_only_empty_lora_series_keeps_adapters() -> None:
    """#423: an empty series (no adapter running or waiting) must not wipe the known adapters."""
    page = QUEUE + KV + lora_line('max_lora="3",running_lora_adapters="",waiting_lora_adapters=""', "5")
    metrics, errors = parse(page + RUNNING, NAMES, PREVIOUS, NOW)
    assert errors == []
    assert metrics.active_models == PREVIOUS.active_models
    assert metrics.waiting_models == PREVIOUS.waiting_models
    assert metrics.waiting_queue_size == 7


def test_max_lora_comes_from_the_newest_series_even_without_adapters() -> None:
    """max_lora is server configuration: a pod that never ran an adapter still has free slots."""
    page = QUEUE + KV + lora_line('max_lora="3",running_lora_adapters="",waiting_lora_adapters=""', "5")
    fresh_pod = Metrics()
    metrics, errors = parse(page + RUNNING, NAMES, fresh_pod, NOW)
    assert errors == []
    assert metrics.max_active_models == 3
    assert metrics.active_models == frozenset()


@pytest.mark.parametrize("bad", ["x", "1.5", "-1", "1_0"])
def test_bad_max_lora_is_an_error_and_keeps_the_field(bad: str) -> None:
    page = QUEUE + RUNNING + KV + lora_line(f'max_lora="{bad}",running_lora_adapters="a"')
    metrics, errors = parse(page, NAMES, PREVIOUS, NOW)
    assert errors == [f"label max_lora={bad!r} is not an integer"]
    assert metrics.max_active_models == PREVIOUS.max_active_models
    assert metrics.active_models == {"a"}, "the adapters of the same series are still used"


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        pytest.param(['{a="1"} 4', '{a="2"} 9'], 4, id="no-timestamps-first-wins"),
        pytest.param(['{a="1"} 4 1000', '{a="2"} 9 2000'], 9, id="greatest-timestamp-wins"),
        pytest.param(['{a="1"} 4 3000', '{a="2"} 9 2000'], 4, id="greatest-timestamp-first"),
        pytest.param(['{a="1"} 4', '{a="2"} 9 2000'], 9, id="timestamped-beats-untimed"),
        pytest.param([" 12.9"], 12, id="value-truncated"),
    ],
)
def test_gauge_series_selection(series: list[str], expected: int) -> None:
    page = "".join(f"vllm:num_requests_waiting{s}\n" for s in series)
    metrics, _ = parse(page, NAMES, PREVIOUS, NOW)
    assert metrics.waiting_queue_size == expected


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_non_finite_gauge_is_an_error(value: str) -> None:
    metrics, errors = parse(f"vllm:kv_cache_usage_perc {value}\n" + QUEUE, NAMES, PREVIOUS, NOW)
    assert any("non-finite" in e for e in errors)
    assert metrics.kv_cache_usage == PREVIOUS.kv_cache_usage
    assert metrics.waiting_queue_size == 7


def test_label_spec_selects_the_series() -> None:
    names = MetricNames(queued_requests="vllm:num_requests_waiting{model_name=b}")
    page = 'vllm:num_requests_waiting{model_name="a"} 1\nvllm:num_requests_waiting{model_name="b"} 2\n'
    metrics, _ = parse(page, names, PREVIOUS, NOW)
    assert metrics.waiting_queue_size == 2


def test_label_spec_without_match_is_an_error() -> None:
    names = MetricNames(queued_requests="vllm:num_requests_waiting{model_name=c}")
    metrics, errors = parse(QUEUE, names, PREVIOUS, NOW)
    assert 'metric "vllm:num_requests_waiting{model_name=c}": no series matches the listed labels' in errors
    assert metrics.waiting_queue_size == PREVIOUS.waiting_queue_size


def test_disabled_metric_is_neither_read_nor_reported() -> None:
    names = MetricNames(lora_info="", running_requests="")
    metrics, errors = parse(QUEUE + KV, names, PREVIOUS, NOW)
    assert errors == []
    assert metrics.active_models == PREVIOUS.active_models


def test_malformed_line_of_a_needed_family_is_an_error() -> None:
    page = 'vllm:num_requests_waiting{model_name="a} 3\n' + KV + RUNNING + LORA
    metrics, errors = parse(page, NAMES, PREVIOUS, NOW)
    assert len(errors) == 1
    assert "vllm:num_requests_waiting" in errors[0]
    assert metrics.waiting_queue_size == PREVIOUS.waiting_queue_size
    assert metrics.kv_cache_usage == 0.25


def test_malformed_line_of_another_family_is_ignored() -> None:
    page = "other_metric{oops 3\n" + FULL
    _, errors = parse(page, NAMES, PREVIOUS, NOW)
    assert errors == []


def test_prefix_names_are_other_metrics() -> None:
    page = "vllm:num_requests_waiting_total 99\nvllm:num_requests_waiting2 98\n" + QUEUE
    metrics, _ = parse(page, NAMES, PREVIOUS, NOW)
    assert metrics.waiting_queue_size == 7


def test_crlf_line_endings() -> None:
    metrics, errors = parse(FULL.replace("\n", "\r\n"), NAMES, Metrics(), NOW)
    assert errors == []
    assert metrics.waiting_queue_size == 7
    assert metrics.max_active_models == 4
