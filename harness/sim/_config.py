"""Settings of one simulated vLLM model server."""

from __future__ import annotations

import dataclasses

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_PORT = 8000
DEFAULT_MAX_NUM_SEQS = 8
DEFAULT_MAX_LORAS = 1
DEFAULT_NUM_GPU_BLOCKS = 1024
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_TOKENS = 16
# 8B model on one H100, from the llm-d-inference-sim latency profiles.
DEFAULT_TTFT_BASE_S = 0.03
DEFAULT_PREFILL_PER_TOKEN_S = 0.0002
DEFAULT_ITL_S = 0.012
DEFAULT_LOAD_FACTOR = 2.0
# Histogram buckets for token counts go up to this length when max_model_len is unset.
DEFAULT_BUCKET_MODEL_LEN = 32768
# Distinct `vllm:lora_requests_info` series kept (vLLM keeps every one it ever set).
MAX_LORA_INFO_SERIES = 64


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """How one simulated vLLM instance behaves.

    Times are simulated seconds; every sleep is multiplied by ``time_scale`` (0.01 runs 100x
    faster) and the latency histograms on ``/metrics`` report the simulated values.
    """

    model: str = DEFAULT_MODEL
    lora_adapters: tuple[str, ...] = ()
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_loras: int = DEFAULT_MAX_LORAS
    num_gpu_blocks: int = DEFAULT_NUM_GPU_BLOCKS
    block_size: int = DEFAULT_BLOCK_SIZE
    # None: no length check; a request larger than the whole KV cache then runs alone.
    max_model_len: int | None = None
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    ttft_base_s: float = DEFAULT_TTFT_BASE_S
    prefill_per_token_s: float = DEFAULT_PREFILL_PER_TOKEN_S
    itl_s: float = DEFAULT_ITL_S
    # Inter-token latency multiplier reached when all max_num_seqs slots are busy (1.0 at one).
    load_factor: float = DEFAULT_LOAD_FACTOR
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_loras < 0:
            raise ValueError("max_loras must be >= 0")
        if self.lora_adapters and self.max_loras < 1:
            raise ValueError("LoRA adapters need max_loras >= 1")
        if self.num_gpu_blocks < 1 or self.block_size < 1:
            raise ValueError("num_gpu_blocks and block_size must be >= 1")
        if self.time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        if self.model in self.lora_adapters:
            raise ValueError(f"LoRA adapter name {self.model!r} is the base model name")
