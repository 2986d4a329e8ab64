"""Reading the simulator's /metrics page the reference way (prometheus_client's parser)."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Gauges:
    waiting: float
    running: float
    kv_cache: float
    running_loras: str
    waiting_loras: str
    max_lora: str


def families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def gauges(text: str) -> Gauges:
    fams = families(text)

    def value(name: str) -> float:
        (sample,) = fams[name].samples
        return sample.value

    newest = max(fams["vllm:lora_requests_info"].samples, key=lambda s: s.value)
    return Gauges(
        waiting=value("vllm:num_requests_waiting"),
        running=value("vllm:num_requests_running"),
        kv_cache=value(
            "vllm:kv_cache_usage_perc" if "vllm:kv_cache_usage_perc" in fams else "vllm:gpu_cache_usage_perc"
        ),
        running_loras=newest.labels["running_lora_adapters"],
        waiting_loras=newest.labels["waiting_lora_adapters"],
        max_lora=newest.labels["max_lora"],
    )


async def scrape(http: aiohttp.ClientSession, base_url: str) -> Gauges:
    async with http.get(f"{base_url}/metrics") as response:
        assert response.status == 200
        return gauges(await response.text())
