"""A realistic-size vLLM /metrics page for the prober benchmarks (no simulator needed).

Families, labels and bucket sets follow vLLM's V1 Prometheus logger plus the process/GC collectors a
real vLLM process exposes; the wanted gauges sit in the middle of the page, as they do in vLLM, so
the targeted scan cannot get lucky by finding them first.
"""

from __future__ import annotations

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LABELS = f'engine="0",model_name="{MODEL}"'

TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
        40.0, 80.0)  # fmt: skip
LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
           240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TOKENS = tuple(float(m * 10**e) for e in range(5) for m in (1, 2, 5) if m * 10**e <= 32768)
ITERATION = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _histogram(name: str, doc: str, buckets: tuple[float, ...]) -> list[str]:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    count = 0
    for i, le in enumerate(buckets):
        count += i
        lines.append(f'{name}_bucket{{{LABELS},le="{float(le)}"}} {float(count)}')
    lines.append(f'{name}_bucket{{{LABELS},le="+Inf"}} {float(count)}')
    lines.append(f"{name}_count{{{LABELS}}} {float(count)}")
    lines.append(f"{name}_sum{{{LABELS}}} {count * 0.731:.6f}")
    lines.append(f"# HELP {name}_created {doc}")
    lines.append(f"# TYPE {name}_created gauge")
    lines.append(f"{name}_created{{{LABELS}}} 1.7461234567e+09")
    return lines


def _counter(name: str, doc: str, value: float, extra: str = "") -> list[str]:
    labels = LABELS + extra
    return [
        f"# HELP {name}_total {doc}",
        f"# TYPE {name}_total counter",
        f"{name}_total{{{labels}}} {value}",
        f"# HELP {name}_created {doc}",
        f"# TYPE {name}_created gauge",
        f"{name}_created{{{labels}}} 1.7461234567e+09",
    ]


def _gauge(name: str, doc: str, value: float, labels: str = LABELS) -> list[str]:
    return [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {value}"]


def _process() -> list[str]:
    lines = []
    for gen in range(3):
        lines += [f'python_gc_objects_collected_total{{generation="{gen}"}} {1000 * (gen + 1)}.0']
        lines += [f'python_gc_objects_uncollectable_total{{generation="{gen}"}} 0.0']
        lines += [f'python_gc_collections_total{{generation="{gen}"}} {50 - gen}.0']
    lines += [
        'python_info{implementation="CPython",major="3",minor="12",patchlevel="9",version="3.12.9"} 1.0',
        "process_virtual_memory_bytes 4.5867536384e+010",
        "process_resident_memory_bytes 2.147483648e+09",
        "process_start_time_seconds 1.74612345e+09",
        "process_cpu_seconds_total 1234.56",
        "process_open_fds 87.0",
        "process_max_fds 1.048576e+06",
    ]
    return lines


def vllm_metrics_page(waiting: int = 3, kv: float = 0.42, running: str = "lora-1", max_lora: int = 4) -> str:
    lines = _process()
    lines += _counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 2.0)
    lines += _counter("vllm:prompt_tokens", "Number of prefill tokens processed.", 123456.0)
    lines += _counter("vllm:generation_tokens", "Number of generation tokens processed.", 654321.0)
    for reason in ("stop", "length", "abort"):
        lines += _counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            42.0,
            f',finished_reason="{reason}"',
        )
    lines += _histogram(
        "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION
    )
    lines += _histogram(
        "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT
    )
    lines += _histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token.", TPOT)
    lines += _histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.", TPOT)
    lines += _histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency.", LATENCY)
    # The wanted gauges, mid-page.
    lines += _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", 5.0)
    lines += _gauge(
        "vllm:num_requests_waiting", "Number of requests waiting to be processed.", float(waiting)
    )
    lines += _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv)
    lines += _gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", kv)
    lora_labels = f'max_lora="{max_lora}",running_lora_adapters="{running}",waiting_lora_adapters=""'
    lines += _gauge("vllm:lora_requests_info", "Running stats on lora requests.", 1.7461239e9, lora_labels)
    lines += _gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        1.0,
        'block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",'
        'num_cpu_blocks="None",num_gpu_blocks="27000",swap_space="4"',
    )
    for name in (
        "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ):
        lines += _histogram(name, "Histogram of time spent in a request phase.", LATENCY)
    lines += _histogram("vllm:request_time_per_output_token_seconds", "Per-request TPOT.", TPOT)
    for name in (
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_max_tokens",
    ):
        lines += _histogram(name, "Histogram of token counts.", TOKENS)
    lines += _histogram("vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20))
    return "\n".join(lines) + "\n"
