"""Metric names, labels and buckets as upstream; pool gauges computed from the datastore at scrape."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.api import v1alpha2
from epp.api.types import PodObject, endpoint_key
from epp.datastore import Datastore, Metrics, new_datastore
from epp.metrics import PoolCollector, RequestMetrics
from epp.metrics.pool import PoolView
from harness.cluster.builders import PodBuilder, PoolBuilder

_typed: PoolView = new_datastore()


def _store(*pods: tuple[str, Metrics | None]) -> Datastore:
    store = new_datastore()
    store.pool_set(v1alpha2.pool_from_api(PoolBuilder("my-pool").selector(app="x").port(8000).build()))
    for i, (name, metrics) in enumerate(pods):
        store.pod_update_or_add(
            PodObject.from_api(PodBuilder(name).labels(app="x").ready(f"10.0.0.{i + 1}").build())
        )
        if metrics is not None:
            store.pod_update_metrics_if_exist(
                endpoint_key(PodObject.from_api(PodBuilder(name).build()).key), metrics
            )
    return store


def _pool_samples(store: Datastore) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(PoolCollector(store))
    return {
        s.name: s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


def test_no_pool_means_no_samples() -> None:
    assert _pool_samples(new_datastore()) == {}


def test_pool_without_pods_reports_zero() -> None:
    assert _pool_samples(_store()) == {
        "inference_pool_average_kv_cache_utilization": 0.0,
        "inference_pool_average_queue_size": 0.0,
        "inference_pool_ready_pods": 0.0,
    }


def test_averages_over_scraped_pods_with_integer_queue_mean() -> None:
    store = _store(
        ("a", Metrics(waiting_queue_size=3, kv_cache_usage=0.2, updated_at=1.0)),
        ("b", Metrics(waiting_queue_size=4, kv_cache_usage=0.4, updated_at=1.0)),
        ("never-scraped", None),
    )
    samples = _pool_samples(store)
    assert samples["inference_pool_ready_pods"] == 3
    assert samples["inference_pool_average_queue_size"] == 3  # (3 + 4) // 2
    assert samples["inference_pool_average_kv_cache_utilization"] == pytest.approx(0.3)


def test_gauges_follow_the_store_without_a_flush() -> None:
    store = _store(("a", Metrics(waiting_queue_size=8, updated_at=1.0)))
    registry = CollectorRegistry()
    registry.register(PoolCollector(store))
    assert registry.get_sample_value("inference_pool_ready_pods", {"name": "my-pool"}) == 1
    store.pod_delete(PodObject.from_api(PodBuilder("a").build()).key)
    assert registry.get_sample_value("inference_pool_ready_pods", {"name": "my-pool"}) == 0
    assert registry.get_sample_value("inference_pool_average_queue_size", {"name": "my-pool"}) == 0


def test_request_metric_names_and_labels() -> None:
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry)
    metrics.request_routed("m", "t", 100)
    metrics.request_failed("m", "t", "BadRequest")
    metrics.response_complete("m", "t", duration=0.3, response_size=10, input_tokens=5, output_tokens=0)
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {
        "inference_model_request",
        "inference_model_request_error",
        "inference_model_request_duration_seconds",
        "inference_model_request_sizes",
        "inference_model_response_sizes",
        "inference_model_input_tokens",
        "inference_model_output_tokens",
        "inference_model_running_requests",
    } <= set(families)
    assert "# TYPE inference_model_request_total counter" in text
    assert all(
        f.documentation.startswith("[ALPHA] ") for f in families.values() if not f.name.endswith("_created")
    )
    labels = {"model_name": "m", "target_model_name": "t"}
    assert registry.get_sample_value("inference_model_request_total", labels) == 1
    assert (
        registry.get_sample_value(
            "inference_model_request_error_total", {**labels, "error_code": "BadRequest"}
        )
        == 1
    )
    assert registry.get_sample_value("inference_model_running_requests", {"model_name": "m"}) == 1
    assert registry.get_sample_value("inference_model_input_tokens_count", labels) == 1
    assert registry.get_sample_value("inference_model_output_tokens_count", labels) is None  # 0 is skipped


@pytest.mark.parametrize(
    ("metric", "buckets"),
    [
        pytest.param("inference_model_response_sizes", [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                                        8192, 16384, 32778, 65536], id="response-sizes"),
        pytest.param("inference_model_output_tokens",
                     [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192], id="output-tokens"),
        pytest.param("inference_model_input_tokens", [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                                                      16384, 32778, 65536, 131072, 262144, 524288, 1048576],
                     id="input-tokens"),
        pytest.param("inference_model_request_sizes", [2.0**i for i in range(6, 31)], id="request-sizes"),
        pytest.param("inference_model_request_duration_seconds",
                     [0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15,
                      20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600],
                     id="duration"),
    ],
)  # fmt: skip
def test_upstream_buckets(metric: str, buckets: list[float]) -> None:
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry)
    metrics.request_routed("m", "t", 1)
    metrics.response_complete("m", "t", duration=1, response_size=1, input_tokens=1, output_tokens=1)
    bounds = [
        float(s.labels["le"])
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
        if s.name == f"{metric}_bucket" and s.labels["le"] != "+Inf"
    ]
    assert bounds == [float(b) for b in buckets]
