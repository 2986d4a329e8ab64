"""The simulator's ``/metrics`` page: real vLLM metric names on a per-instance registry.

Gauges (queue, KV, LoRA) and the engine's counters (preemptions, prefix-cache queries and hits) are
computed at scrape time from the engine's state, with an optional override layer that tests pin on
the gauges; histograms and the request counters are observed as requests finish. The KV gauge and
the prefix-cache counters carry the names of the configured ``vllm_version``, never both sets. The
families, labels and bucket sets follow vLLM's V1 Prometheus logger, and the page carries the
process/platform/GC collectors a real vLLM process exposes, so it is tens of KB as in production.
With ``engine`` sglang or trtllm-serve the scrape-time gauges carry that engine's names instead (and
its KV geometry), with no vLLM state gauge, LoRA info or prefix-cache counter beside them; the
request histograms keep vLLM's names (no EPP reads them).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from harness.sim._config import (
    DEFAULT_BUCKET_MODEL_LEN,
    ENGINE_GAUGE_NAMES,
    SGLANG_ENGINE,
    EngineGaugeNames,
    SimConfig,
)
from harness.sim._engine import Engine, EngineState, Timings

ENGINE_LABEL = "0"
PROCESS_RENDER_INTERVAL_S = 1.0
OBSERVED_RENDER_INTERVAL_S = 0.1

# Bucket sets of vLLM's V1 Prometheus stat logger.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclasses.dataclass(frozen=True)
class GaugeOverrides:
    """Pinned gauge values; None leaves the real value in place."""

    waiting: float | None = None
    running: float | None = None
    kv_cache: float | None = None
    running_loras: tuple[str, ...] | None = None
    waiting_loras: tuple[str, ...] | None = None
    max_lora: int | None = None
    # Unix time reported for the pinned vllm:lora_requests_info series.
    lora_updated_at: float = 0.0

    @property
    def pins_loras(self) -> bool:
        return self.running_loras is not None or self.waiting_loras is not None or self.max_lora is not None


class _StateCollector(Collector):
    """Scrape-time gauges from the engine state, overridden where a test pinned them."""

    def __init__(self, sim_metrics: SimMetrics) -> None:
        self._m = sim_metrics

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        cfg = self._m.config
        state = self._m.engine.state()
        ov = self._m.overrides
        labels = ["model_name", "engine"]
        values = [cfg.model, ENGINE_LABEL]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        other = ENGINE_GAUGE_NAMES.get(cfg.engine)
        if other is not None:
            yield from self._other_engine(other, gauge, state, ov)
            return

        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            _pick(ov.running, state.running),
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            _pick(ov.waiting, state.waiting),
        )
        names = cfg.metric_names
        kv = _pick(ov.kv_cache, state.kv_cache_usage)
        yield gauge(names.kv_cache_usage, "KV-cache usage. 1 means 100 percent usage.", kv)
        counters = self._m.engine.counters()

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        yield counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", counters.preemptions
        )
        yield counter(
            names.prefix_cache_queries,
            "Prefix cache queries, in terms of number of queried tokens.",
            counters.prefix_queries,
        )
        yield counter(
            names.prefix_cache_hits,
            "Prefix cache hits, in terms of number of cached tokens.",
            counters.prefix_hits,
        )
        yield self._lora_info(state, ov)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(self._m.cache_config_labels),
        )
        info.add_metric(list(self._m.cache_config_labels.values()), 1.0)
        yield info

    def _other_engine(
        self,
        names: EngineGaugeNames,
        gauge: Callable[[str, str, float], GaugeMetricFamily],
        state: EngineState,
        ov: GaugeOverrides,
    ) -> Iterable[GaugeMetricFamily]:
        """An SGLang or trtllm-serve page: the same engine state under that engine's names."""
        cfg = self._m.config
        yield gauge(
            names.waiting, "Number of requests waiting in the queue.", _pick(ov.waiting, state.waiting)
        )
        yield gauge(names.running, "Number of running requests.", _pick(ov.running, state.running))
        yield gauge(
            names.kv_cache_usage, "KV-cache usage (0 to 1).", _pick(ov.kv_cache, state.kv_cache_usage)
        )
        if cfg.engine == SGLANG_ENGINE:
            info = GaugeMetricFamily(
                "sglang:cache_config_info", "KV cache configuration.", labels=["page_size", "num_pages"]
            )
            info.add_metric([str(cfg.block_size), str(cfg.num_gpu_blocks)], 1.0)
            yield info
        else:
            yield gauge("trtllm_kv_cache_tokens_per_block", "Tokens per KV-cache block.", cfg.block_size)
            yield gauge("trtllm_kv_cache_max_blocks", "KV-cache blocks.", cfg.num_gpu_blocks)

    def _lora_info(self, state: EngineState, ov: GaugeOverrides) -> GaugeMetricFamily:
        cfg = self._m.config
        family = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        if ov.pins_loras:
            running = state.running_loras if ov.running_loras is None else ov.running_loras
            waiting = state.waiting_loras if ov.waiting_loras is None else ov.waiting_loras
            max_lora = cfg.max_loras if ov.max_lora is None else ov.max_lora
            family.add_metric([str(max_lora), ",".join(waiting), ",".join(running)], ov.lora_updated_at)
            return family
        for running_s, waiting_s, ts in self._m.engine.lora_series():
            family.add_metric([str(cfg.max_loras), waiting_s, running_s], ts)
        return family


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _exposition(families: Iterable[Metric]) -> bytes:
    """The text format of a few families, as ``generate_latest`` writes it, without its overhead
    (this part of the page is rendered at every scrape)."""
    out: list[str] = []
    for family in families:
        help_text = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        name = family.name + "_total" if family.type == "counter" else family.name
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {family.type}\n")
        for sample in family.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(sample.labels.items()))
            out.append(f"{sample.name}{{{labels}}} {_go_float(sample.value)}\n")
    return "".join(out).encode()


def _go_float(value: float) -> str:
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _pick(override: float | None, real: float) -> float:
    return float(real) if override is None else float(override)


class SimMetrics:
    """All Prometheus families of one simulator instance, on its own registry."""

    def __init__(self, config: SimConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        # Three registries, rendered separately: scrape-time engine state (always current), the
        # process/platform/GC collectors a real vLLM process also exposes (slow to render, slow to
        # change: re-rendered at most every PROCESS_RENDER_INTERVAL_S) and the request histograms and
        # counters (most of the page: re-rendered after new observations, at most every
        # OBSERVED_RENDER_INTERVAL_S). Several EPPs scraping eight simulators every 50 ms in one
        # process would otherwise spend a core rendering.
        self.live_registry = CollectorRegistry()
        self.process_registry = CollectorRegistry()
        self.observed_registry = CollectorRegistry()
        self._observed_cache: bytes | None = None
        self._observed_dirty = True
        self._observed_at = 0.0
        self._process_cache = b""
        self._process_at = -math.inf
        # Replaced as a whole (one reference swap), so a test thread can pin values safely.
        self.overrides = GaugeOverrides()
        self._lock = threading.Lock()
        self.cache_config_labels = {
            "block_size": str(config.block_size),
            "cache_dtype": "auto",
            "calculate_kv_scales": "False",
            "cpu_offload_gb": "0",
            "enable_prefix_caching": str(config.enable_prefix_caching),
            "gpu_memory_utilization": "0.9",
            "is_attention_free": "False",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(config.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "builtin",
            "sliding_window": "None",
            "swap_space": "4",
            "swap_space_bytes": str(4 * 1024**3),
        }
        self._state = _StateCollector(self)
        self.live_registry.register(self._state)
        ProcessCollector(registry=self.process_registry)
        PlatformCollector(registry=self.process_registry)
        GCCollector(registry=self.process_registry)
        reg = self.observed_registry
        labels = ("model_name", "engine")

        token_buckets = build_1_2_5_buckets(config.max_model_len or DEFAULT_BUCKET_MODEL_LEN)

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, (*labels, *extra), registry=reg)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, labels, registry=reg, buckets=buckets)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ("finished_reason",)
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self.request_max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        self.request_params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS
        )
        self.request_params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", token_buckets
        )
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.time_per_output_token = histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds. DEPRECATED: use "
            "vllm:inter_token_latency_seconds.",
            TPOT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TPOT_BUCKETS
        )
        self.request_time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TPOT_BUCKETS,
        )
        self.e2e_request_latency = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        # vLLM creates every labelled child up front, so the page is full-size before traffic. They
        # are kept: a finished request then costs no label look-up (each takes a lock, builds a key).
        child = (config.model, ENGINE_LABEL)
        self._series: dict[Counter | Histogram, Any] = {
            metric: metric.labels(*child)
            for metric in (
                self.prompt_tokens, self.generation_tokens, self.iteration_tokens, self.request_prompt_tokens,
                self.request_generation_tokens, self.request_max_num_generation_tokens, self.request_params_n,
                self.request_params_max_tokens, self.time_to_first_token, self.time_per_output_token,
                self.inter_token_latency, self.request_time_per_output_token, self.e2e_request_latency,
                self.request_queue_time, self.request_inference_time, self.request_prefill_time,
                self.request_decode_time,
            )
        }  # fmt: skip
        self._successes = {
            reason: self.request_success.labels(*child, reason) for reason in ("stop", "length", "abort")
        }

    def render(self) -> bytes:
        now = time.monotonic()
        if now - self._process_at >= PROCESS_RENDER_INTERVAL_S:
            self._process_cache = generate_latest(self.process_registry)
            self._process_at = now
        if self._observed_cache is None or (
            self._observed_dirty and now - self._observed_at >= OBSERVED_RENDER_INTERVAL_S
        ):
            self._observed_cache = generate_latest(self.observed_registry)
            self._observed_dirty = False
            self._observed_at = now
        return _exposition(self._state.collect()) + self._process_cache + self._observed_cache

    def pin(self, update: Callable[[GaugeOverrides], GaugeOverrides]) -> None:
        with self._lock:
            self.overrides = update(self.overrides)

    def clear(self) -> None:
        with self._lock:
            self.overrides = GaugeOverrides()

    def observe_finished(
        self, *, prompt_tokens: int, generated: int, max_tokens: int, timings: Timings, reason: str
    ) -> None:
        series = self._series
        self._observed_dirty = True
        self._successes[reason].inc()
        series[self.prompt_tokens].inc(prompt_tokens)
        series[self.generation_tokens].inc(generated)
        if reason == "abort":  # latencies of aborted requests would only blur the histograms
            return
        # The simulator has no engine steps; the prefill step is the one it can report honestly.
        series[self.iteration_tokens].observe(prompt_tokens)
        series[self.request_prompt_tokens].observe(prompt_tokens)
        series[self.request_generation_tokens].observe(generated)
        series[self.request_max_num_generation_tokens].observe(max_tokens)
        series[self.request_params_n].observe(1)
        series[self.request_params_max_tokens].observe(max_tokens)
        if generated > 0:
            series[self.time_to_first_token].observe(timings.ttft_s)
        tpot, itl_series = series[self.time_per_output_token], series[self.inter_token_latency]
        for itl in timings.inter_token_s:
            tpot.observe(itl)
            itl_series.observe(itl)
        if generated > 1:
            series[self.request_time_per_output_token].observe(timings.decode_s / (generated - 1))
        series[self.e2e_request_latency].observe(timings.e2e_s)
        series[self.request_queue_time].observe(timings.queue_s)
        series[self.request_inference_time].observe(timings.prefill_s + timings.decode_s)
        series[self.request_prefill_time].observe(timings.prefill_s)
        series[self.request_decode_time].observe(timings.decode_s)
