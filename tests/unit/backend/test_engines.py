"""The prober reads each pod's engine's metric names (vllm, sglang, trtllm-serve, triton-tensorrt-llm,
or a config's own), and scrapes where `ProberConfig` says (scheme, path, port)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

import pytest

from epp.api.types import EndpointKey
from epp.backend.metrics.fetch import metrics_url
from epp.backend.metrics.refresher import PodRefreshers, engine_of
from epp.config import ENGINE_LABEL_KEY, MetricNames, ProberConfig
from epp.datastore import Datastore
from epp.datastore.types import Metrics, Pod, PodMetrics
from harness.base.eventually import eventually_async

# One page carrying every engine's families, each with its own numbers.
PAGE = """\
vllm:num_requests_waiting 1
vllm:num_requests_running 2
vllm:kv_cache_usage_perc 0.1
sglang:num_queue_reqs 3
sglang:num_running_reqs 4
sglang:token_usage 0.3
trtllm_num_requests_waiting 5
trtllm_num_requests_running 6
trtllm_kv_cache_utilization 0.5
nv_trt_llm_request_metrics{request_type="waiting"} 7
nv_trt_llm_request_metrics{request_type="scheduled"} 8
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"} 0.7
mine_queue 9
"""


class FakeStore:
    """The two datastore calls a refresher makes."""

    def __init__(self, pods: dict[str, Pod]) -> None:
        self.pods = {p.key: PodMetrics(p) for p in pods.values()}

    def pod_get(self, key: EndpointKey) -> PodMetrics | None:
        return self.pods.get(key)

    def pod_update_metrics_if_exist(
        self, key: EndpointKey, metrics: Metrics, *, address: str, port: int
    ) -> bool:
        self.pods[key] = PodMetrics(self.pods[key].pod, metrics)
        return True


class Fetcher:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def fetch(self, address: str, port: int) -> str:
        self.calls.append((address, port))
        return PAGE


def _pod(name: str, engine: str | None) -> Pod:
    """A pod labelled with its engine (None: no engine label at all)."""
    labels = () if engine is None else ((ENGINE_LABEL_KEY, engine),)
    return Pod(EndpointKey("ns", name), f"10.0.0.{len(name)}", 8000, labels)


ENGINES = [
    pytest.param(None, (1, 2, 0.1), id="no-engine-label-is-vllm"),
    pytest.param("", (1, 2, 0.1), id="unlabelled-is-vllm"),
    pytest.param("vllm", (1, 2, 0.1), id="vllm"),
    pytest.param("sglang", (3, 4, 0.3), id="sglang"),
    pytest.param("trtllm-serve", (5, 6, 0.5), id="trtllm-serve"),
    pytest.param("triton-tensorrt-llm", (7, 8, 0.7), id="triton"),
    pytest.param("tgi", (1, 2, 0.1), id="unknown-engine-is-the-default"),
]


async def _scrape(config: ProberConfig, pods: dict[str, Pod]) -> tuple[FakeStore, Fetcher]:
    store, fetcher = FakeStore(pods), Fetcher()
    refreshers = await PodRefreshers.create(fetcher, config, itertools.count(100).__next__)
    try:
        for key in store.pods:
            refreshers.pod_added(key, cast(Datastore, store))

        async def scraped() -> None:
            assert all(p.metrics.updated_at is not None for p in store.pods.values())

        await eventually_async(scraped, timeout=5)
    finally:
        await refreshers.aclose()
    return store, fetcher


@pytest.mark.parametrize(("engine", "expected"), ENGINES)
def test_each_pod_is_read_with_its_engines_metric_names(
    engine: str | None, expected: tuple[Any, ...]
) -> None:
    store, _ = asyncio.run(_scrape(ProberConfig(refresh_interval=3600), {"p": _pod("p", engine)}))
    m = next(iter(store.pods.values())).metrics
    assert (m.waiting_queue_size, m.running_queue_size, m.kv_cache_usage) == expected


def test_pods_of_different_engines_side_by_side_and_a_configured_default() -> None:
    mine = MetricNames(queued_requests="mine_queue", running_requests="", kv_cache_usage="", lora_info="")
    config = ProberConfig(
        refresh_interval=3600,
        default_engine="mine",
        metric_names=mine,
        engines=(*ProberConfig().engines, ("mine", mine)),
    )
    pods = {"a": _pod("a", "sglang"), "bb": _pod("bb", ""), "ccc": _pod("ccc", "vllm")}
    store, _ = asyncio.run(_scrape(config, pods))
    waiting = {k.name: p.metrics.waiting_queue_size for k, p in store.pods.items()}
    assert waiting == {"a": 3, "bb": 9, "ccc": 1}


def test_the_metrics_port_override_wins_over_the_target_port() -> None:
    _, fetcher = asyncio.run(_scrape(ProberConfig(refresh_interval=3600, port=9100), {"p": _pod("p", "")}))
    assert {port for _, port in fetcher.calls} == {9100}
    _, fetcher = asyncio.run(_scrape(ProberConfig(refresh_interval=3600), {"p": _pod("p", "")}))
    assert {port for _, port in fetcher.calls} == {8000}


def test_engine_of_reads_the_configured_label() -> None:
    assert engine_of(_pod("p", None), ENGINE_LABEL_KEY) == ""
    assert engine_of(_pod("p", "sglang"), ENGINE_LABEL_KEY) == "sglang"
    assert engine_of(_pod("p", "sglang"), "example.com/engine") == ""


@pytest.mark.parametrize(
    ("address", "scheme", "path", "url"),
    [
        pytest.param("10.0.0.1", "http", "/metrics", "http://10.0.0.1:8000/metrics", id="default"),
        pytest.param(
            "10.0.0.1",
            "https",
            "/prometheus/metrics",
            "https://10.0.0.1:8000/prometheus/metrics",
            id="trtllm",
        ),
        pytest.param("fd00::1", "http", "/metrics", "http://[fd00::1]:8000/metrics", id="ipv6"),
    ],
)
def test_metrics_url(address: str, scheme: str, path: str, url: str) -> None:
    assert metrics_url(address, 8000, scheme=scheme, path=path) == url
