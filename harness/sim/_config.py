"""Settings of one simulated vLLM model server, and where its constants come from."""

from __future__ import annotations

import dataclasses
import re

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_PORT = 8000
DEFAULT_MAX_NUM_SEQS = 8
DEFAULT_MAX_LORAS = 1
DEFAULT_NUM_GPU_BLOCKS = 1024
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_TOKENS = 16
# vLLM V1's token budget per engine step for online serving (chunked prefill splits longer prompts).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

# Step-time model: one engine iteration (a batch of prefill chunks and decode tokens) takes
#   step = base + prefill_token * (uncached prefill tokens) + decode_token * (decode tokens)
#          + context_token * (tokens of context the batch attends to) [+ lora_load per adapter loaded]
# base, prefill_token and decode_token are BLIS's coefficients for Llama-3.1-8B-Instruct on one H100
# (TP=1) under vLLM v0.8.4, fitted to measured vLLM runs (inference-sim/inference-sim, defaults.yaml,
# beta_coeffs = [5752.7, 17.25, 6.0] microseconds; the model is described in docs/approach.md). So a
# decode step at batch 8 takes ~5.8 ms and a 1,000-token prefill ~23 ms, in line with
# llm-d-inference-sim's 8B/H100 profile (ITL 10-15 ms and TTFT 60-120 ms under load).
DEFAULT_STEP_BASE_S = 5.7527e-3
DEFAULT_PREFILL_TOKEN_S = 17.25e-6
DEFAULT_DECODE_TOKEN_S = 6.0e-6
# BLIS has no context term; attention reads every context token's K and V once per step: 128 KiB per
# token for Llama-3.1-8B (32 layers x 8 KV heads x 128 dims x K,V x 2 bytes) at the H100 SXM's
# 3.35 TB/s HBM3 is 0.039 us per token of context (derived from the data sheet, not measured).
DEFAULT_CONTEXT_TOKEN_S = 3.9e-8
# Loading an adapter from host memory into a GPU slot blocks the step that needs it: a rank-16 adapter
# on every linear layer of an 8B model is ~84 MB in bf16, ~3 ms over PCIe Gen5, plus vLLM's slot
# activation; 10 ms is our rounded estimate (no published measurement found).
DEFAULT_LORA_LOAD_S = 0.010

# vLLM renamed the KV-cache gauge (and the prefix-cache counters) in 0.10: `vllm:gpu_cache_usage_perc`
# became `vllm:kv_cache_usage_perc` (vllm PR #30041, reference/peers-and-simulators.md §2.9). A
# simulator reports exactly one of the two name sets, the one of its `vllm_version`.
KV_RENAME_VERSION = (0, 10, 0)
DEFAULT_VLLM_VERSION = "0.11.0"
OLD_VLLM_VERSION = "0.9.2"

# Histogram buckets for token counts go up to this length when max_model_len is unset.
DEFAULT_BUCKET_MODEL_LEN = 32768
# Distinct `vllm:lora_requests_info` series kept (vLLM keeps every one it ever set).
MAX_LORA_INFO_SERIES = 64

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int]:
    """`0.9.2`, `0.10`, `0.11.0rc1` -> (major, minor, patch); ValueError otherwise."""
    match = _VERSION.match(text)
    if match is None:
        raise ValueError(f"vllm_version must look like 0.10.1, got {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


@dataclasses.dataclass(frozen=True)
class MetricNameSet:
    """The version-dependent metric names of one vLLM release."""

    kv_cache_usage: str
    prefix_cache_queries: str
    prefix_cache_hits: str


NEW_NAMES = MetricNameSet(
    kv_cache_usage="vllm:kv_cache_usage_perc",
    prefix_cache_queries="vllm:prefix_cache_queries",
    prefix_cache_hits="vllm:prefix_cache_hits",
)
OLD_NAMES = MetricNameSet(
    kv_cache_usage="vllm:gpu_cache_usage_perc",
    prefix_cache_queries="vllm:gpu_prefix_cache_queries",
    prefix_cache_hits="vllm:gpu_prefix_cache_hits",
)


def metric_names(vllm_version: str) -> MetricNameSet:
    return NEW_NAMES if parse_version(vllm_version) >= KV_RENAME_VERSION else OLD_NAMES


# The model-server engine the simulator poses as (the EPP picks metric names per pod by the label
# `inference.networking.k8s.io/engine-type`, upstream v1.5; reference/upstream-v1.md §d): vLLM's
# whole page, or another engine's queue, running and KV gauges (with the KV geometry it publishes)
# and none of vLLM's state gauges, LoRA info or prefix-cache counters.
VLLM_ENGINE = "vllm"
SGLANG_ENGINE = "sglang"
TRTLLM_SERVE_ENGINE = "trtllm-serve"
SIM_ENGINES = (VLLM_ENGINE, SGLANG_ENGINE, TRTLLM_SERVE_ENGINE)


@dataclasses.dataclass(frozen=True)
class EngineGaugeNames:
    """An engine's names for the three gauges an EPP schedules on."""

    waiting: str
    running: str
    kv_cache_usage: str


ENGINE_GAUGE_NAMES = {
    SGLANG_ENGINE: EngineGaugeNames("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"),
    TRTLLM_SERVE_ENGINE: EngineGaugeNames(
        "trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization"
    ),
}


# ---- the calibrated preset: one H100 80GB serving Llama-3.1-8B-Instruct with vLLM V1's defaults ----
# KV blocks come from GPU memory as vLLM sizes them: gpu_memory_utilization (default 0.9) of the card,
# minus the weights and the activation peak vLLM's profiling run measures, divided by one block's
# K and V. Llama-3.1-8B: 8.03e9 bf16 parameters (14.96 GiB); per token 32 layers x 8 KV heads x 128
# dims x (K, V) x 2 bytes = 128 KiB, so a 16-token block is 2 MiB. The activation and CUDA-graph
# overhead (4 GiB) is our estimate, not a measurement: with it the card holds ~26,900 blocks
# (~430,000 tokens).
H100_MEMORY_GIB = 80.0
GPU_MEMORY_UTILIZATION = 0.9
LLAMA_8B_WEIGHTS_GIB = 8.03e9 * 2 / 2**30
LLAMA_8B_KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
RUNTIME_OVERHEAD_GIB = 4.0
VLLM_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs
VLLM_MAX_LORAS = 1  # vLLM's default --max-loras


def kv_blocks_from_memory(
    *,
    gpu_memory_gib: float = H100_MEMORY_GIB,
    utilization: float = GPU_MEMORY_UTILIZATION,
    weights_gib: float = LLAMA_8B_WEIGHTS_GIB,
    overhead_gib: float = RUNTIME_OVERHEAD_GIB,
    kv_bytes_per_token: int = LLAMA_8B_KV_BYTES_PER_TOKEN,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> int:
    """KV-cache blocks vLLM would allocate: what is left of the memory budget, in whole blocks."""
    free = (gpu_memory_gib * utilization - weights_gib - overhead_gib) * 2**30
    return max(1, int(free // (kv_bytes_per_token * block_size)))


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """How one simulated vLLM instance behaves.

    Times are simulated seconds; every sleep is multiplied by ``time_scale`` (0.01 runs 100x
    faster; 0 runs steps back to back, for tests) and the latency histograms on ``/metrics`` report
    the simulated values.
    """

    model: str = DEFAULT_MODEL
    lora_adapters: tuple[str, ...] = ()
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_loras: int = DEFAULT_MAX_LORAS
    num_gpu_blocks: int = DEFAULT_NUM_GPU_BLOCKS
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    enable_prefix_caching: bool = True
    # None: no length check; a request larger than the whole KV cache then runs alone.
    max_model_len: int | None = None
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    step_base_s: float = DEFAULT_STEP_BASE_S
    prefill_token_s: float = DEFAULT_PREFILL_TOKEN_S
    decode_token_s: float = DEFAULT_DECODE_TOKEN_S
    context_token_s: float = DEFAULT_CONTEXT_TOKEN_S
    lora_load_s: float = DEFAULT_LORA_LOAD_S
    vllm_version: str = DEFAULT_VLLM_VERSION
    engine: str = VLLM_ENGINE
    time_scale: float = 1.0
    # Also serve HTTP/2 over cleartext (prior knowledge) on the serving port, beside HTTP/1.1 (the
    # model server of a pool with `appProtocol: kubernetes.io/h2c`; `harness.sim._h2c`).
    h2c: bool = False

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_loras < 0:
            raise ValueError("max_loras must be >= 0")
        if self.lora_adapters and self.max_loras < 1:
            raise ValueError("LoRA adapters need max_loras >= 1")
        if self.num_gpu_blocks < 1 or self.block_size < 1:
            raise ValueError("num_gpu_blocks and block_size must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        for name in ("step_base_s", "prefill_token_s", "decode_token_s", "context_token_s", "lora_load_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.model in self.lora_adapters:
            raise ValueError(f"LoRA adapter name {self.model!r} is the base model name")
        parse_version(self.vllm_version)
        if self.engine not in SIM_ENGINES:
            raise ValueError(f"engine must be one of {', '.join(SIM_ENGINES)}, got {self.engine!r}")

    @property
    def metric_names(self) -> MetricNameSet:
        return metric_names(self.vllm_version)


def h100_llama_8b(**changes: object) -> SimConfig:
    """The calibrated engine: vLLM V1's defaults on one H100 80GB (256 sequences, 16-token blocks, the KV
    blocks its memory holds, prefix caching on, one LoRA slot), the step-time constants above.
    ``SimConfig()`` stays the small engine (8 sequences, 1,024 blocks) for fast tests."""
    values: dict[str, object] = {
        "max_num_seqs": VLLM_MAX_NUM_SEQS,
        "max_loras": VLLM_MAX_LORAS,
        "num_gpu_blocks": kv_blocks_from_memory(),
        "block_size": DEFAULT_BLOCK_SIZE,
        "enable_prefix_caching": True,
    }
    values.update(changes)
    return SimConfig(**values)  # type: ignore[arg-type]
