"""Upstream v1.5's metric names in v1 mode (reference/upstream-v1.md §e): `inference_objective_*`
with `priority` on request_total, the pool's running-request average, scheduler time, build info."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.config import SchedulerConfig
from epp.datastore import Metrics
from epp.errors import NoEndpoints
from epp.metrics import PoolCollector, RequestMetrics, TimedScheduler
from epp.scheduling import LLMRequest, new_scheduler
from tests.unit.metrics.test_metrics import _store
from tests.unit.scheduling.pods import NOW, pm

LABELS = {"model_name": "m", "target_model_name": "t"}


def _families(registry: CollectorRegistry) -> set[str]:
    return {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_v1_request_metric_names_labels_and_priority() -> None:
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry, api_v1=True, build=("abc123", "1.2.3"))
    metrics.request_routed("m", "t", 100, priority=-1)
    metrics.request_routed("m", "t", 100)
    metrics.request_failed("m", "t", "BadRequest")
    metrics.response_complete("m", "t", duration=0.3, response_size=10, input_tokens=5, output_tokens=2)
    assert {
        "inference_objective_request",
        "inference_objective_request_error",
        "inference_objective_request_duration_seconds",
        "inference_objective_request_sizes",
        "inference_objective_response_sizes",
        "inference_objective_input_tokens",
        "inference_objective_output_tokens",
        "inference_objective_running_requests",
        "inference_extension_scheduler_e2e_duration_seconds",
        "inference_extension_info",
    } <= _families(registry)
    assert not any(name.startswith("inference_model_") for name in _families(registry))
    value = registry.get_sample_value
    assert value("inference_objective_request_total", {**LABELS, "priority": "-1"}) == 1
    assert value("inference_objective_request_total", {**LABELS, "priority": "0"}) == 1
    assert value("inference_objective_request_error_total", {**LABELS, "error_code": "BadRequest"}) == 1
    assert value("inference_objective_running_requests", {"model_name": "m"}) == 2
    assert value("inference_objective_output_tokens_sum", LABELS) == 2
    assert value("inference_extension_info", {"commit": "abc123", "build_ref": "1.2.3"}) == 1


def test_v1alpha2_keeps_v03_names_and_ignores_priority() -> None:
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry)
    metrics.request_routed("m", "t", 100, priority=5)
    metrics.scheduled(0.001)
    assert registry.get_sample_value("inference_model_request_total", LABELS) == 1
    assert not any(
        name.startswith(("inference_objective_", "inference_extension_")) for name in _families(registry)
    )


def test_v1_pool_gauges_add_the_running_request_average() -> None:
    store = _store(
        ("a", Metrics(waiting_queue_size=1, running_queue_size=3, updated_at=1.0)),
        ("b", Metrics(running_queue_size=4, updated_at=1.0)),
        ("never-scraped", None),
    )
    registry = CollectorRegistry()
    registry.register(PoolCollector(store, api_v1=True))
    assert registry.get_sample_value("inference_pool_average_running_requests", {"name": "my-pool"}) == 3.5
    assert registry.get_sample_value("inference_pool_ready_pods", {"name": "my-pool"}) == 3
    v1alpha2 = CollectorRegistry()
    v1alpha2.register(PoolCollector(store))
    assert v1alpha2.get_sample_value("inference_pool_average_running_requests", {"name": "my-pool"}) is None


def test_scheduler_time_is_recorded_for_every_decision_failed_ones_too() -> None:
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry, api_v1=True)
    ticks = iter([10.0, 10.003, 20.0, 20.0005])
    timed = TimedScheduler(
        new_scheduler(SchedulerConfig(), random.Random(0), lambda: NOW), metrics, lambda: next(ticks)
    )
    request = LLMRequest("m", "m", critical=True)
    pods = [pm("p1"), pm("p2")]
    assert timed.rank(request, pods, 1)[0] in pods
    with pytest.raises(NoEndpoints):
        timed.rank(request, [], 1)
    name = "inference_extension_scheduler_e2e_duration_seconds"
    assert registry.get_sample_value(f"{name}_count") == 2
    assert registry.get_sample_value(f"{name}_sum") == pytest.approx(0.0035)
    assert registry.get_sample_value(f"{name}_bucket", {"le": "0.001"}) == 1
    assert registry.get_sample_value(f"{name}_bucket", {"le": "0.005"}) == 2
