"""Pool-level gauges computed from the datastore when Prometheus scrapes.

Upstream ran a flush loop every `refreshPrometheusMetricsInterval` and skipped it when the pool had no
pods, so the gauges kept stale values (epp-behaviour.md §9 item 24). Reading the datastore at scrape
time has neither problem: every scrape sees the current pods. Choices:
- no pool known: no samples at all (there is no `name` label value to report);
- a pool with 0 pods: all three gauges report 0;
- averages are over the pods that have been scraped at least once, because a never-scraped pod's
  all-zero metrics are not a measurement; `ready_pods` counts every pod in the store;
- the queue average is an integer mean (floor), as upstream;
- with v1 names (`api_v1`), also `inference_pool_average_running_requests` (a float mean, as the
  KV average), which upstream v1.5 added.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.api.types import InferencePool
from epp.datastore.types import PodMetrics

AVG_KV_CACHE = "inference_pool_average_kv_cache_utilization"
AVG_QUEUE = "inference_pool_average_queue_size"
READY_PODS = "inference_pool_ready_pods"
AVG_RUNNING = "inference_pool_average_running_requests"


class PoolView(Protocol):
    """The two datastore reads the collector needs (the Datastore Protocol satisfies it)."""

    def pool_get(self) -> InferencePool | None: ...

    def pod_get_all(self) -> Sequence[PodMetrics]: ...


def _families(api_v1: bool) -> list[GaugeMetricFamily]:
    families = [
        GaugeMetricFamily(
            AVG_KV_CACHE,
            "[ALPHA] The average kv cache utilization for an inference server pool.",
            labels=("name",),
        ),
        GaugeMetricFamily(
            AVG_QUEUE,
            "[ALPHA] The average number of requests pending in the model server queue.",
            labels=("name",),
        ),
        GaugeMetricFamily(
            READY_PODS,
            "[ALPHA] The number of ready pods in the inference server pool.",
            labels=("name",),
        ),
    ]
    if api_v1:
        families.append(
            GaugeMetricFamily(
                AVG_RUNNING,
                "[ALPHA] The mean number of requests the pool's model servers are running.",
                labels=("name",),
            )
        )
    return families


class PoolCollector(Collector):
    """Register with `registry.register(PoolCollector(datastore))`; reads only, never caches."""

    def __init__(self, datastore: PoolView, *, api_v1: bool = False) -> None:
        self._datastore = datastore
        self._v1 = api_v1

    def describe(self) -> Iterator[Metric]:
        # Lets the registry check names at registration without reading the datastore.
        yield from _families(self._v1)

    def collect(self) -> Iterator[Metric]:
        pool = self._datastore.pool_get()
        families = _families(self._v1)
        kv, queue, ready = families[:3]
        if pool is not None:
            pods = self._datastore.pod_get_all()
            scraped = [p.metrics for p in pods if p.metrics.updated_at is not None]
            n = len(scraped)
            name = pool.key.name
            kv.add_metric((name,), sum(m.kv_cache_usage for m in scraped) / n if n else 0.0)
            queue.add_metric((name,), sum(m.waiting_queue_size for m in scraped) // n if n else 0)
            ready.add_metric((name,), len(pods))
            if self._v1:
                running = sum(m.running_queue_size for m in scraped) / n if n else 0.0
                families[3].add_metric((name,), running)
        yield from families
