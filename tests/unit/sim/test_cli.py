"""The simulator's command lines: ours (every SimConfig field a flag or VLLM_SIM_* variable) and
llm-d-inference-sim's, which upstream's manifests use and the node agent maps to ours."""

from __future__ import annotations

from typing import Any

import pytest

from harness.sim import ADMIN_PORT_OFFSET, SimConfig, sim_args
from harness.sim._cli import build_parser, config_from, serve_options
from harness.sim._llmd import FlagError
from harness.sim._llmd import serve_options as llmd_options


def ours(argv: list[str], env: dict[str, str] | None = None) -> Any:
    return serve_options(build_parser().parse_args(argv), env or {})


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(SimConfig(), id="defaults"),
        pytest.param(
            SimConfig(model="m", lora_adapters=("a", "b"), max_loras=2, time_scale=0.05), id="loras"
        ),
        pytest.param(
            SimConfig(max_model_len=4096, enable_prefix_caching=False, vllm_version="0.9.2"), id="misc"
        ),
        pytest.param(SimConfig(step_base_s=1e-3, prefill_token_s=2.5e-5, num_gpu_blocks=48), id="floats"),
    ],
)
def test_sim_args_round_trip_through_the_parser(config: SimConfig) -> None:
    assert config_from(build_parser().parse_args(sim_args(config)), {}) == config


def test_flags_win_over_environment_variables_which_win_over_defaults() -> None:
    options = ours(["--model=flag"], {"VLLM_SIM_MODEL": "env", "VLLM_SIM_TIME_SCALE": "0.5",
                                     "VLLM_SIM_LORA": "x,y", "EPP_HARNESS_POD_IP": "127.0.9.9"})  # fmt: skip
    assert options.config.model == "flag"
    assert options.config.time_scale == 0.5
    assert options.config.lora_adapters == ("x", "y")
    assert options.host == "127.0.9.9", "binds the pod's address the agent gives it"
    assert options.admin_port == 8000 + ADMIN_PORT_OFFSET


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        pytest.param(["--host=0.0.0.0"], {}, "loopback", id="not-loopback"),
        pytest.param([], {"VLLM_SIM_MAX_NUM_SEQS": "many"}, "VLLM_SIM_MAX_NUM_SEQS", id="bad-env"),
        pytest.param(["--max-num-seqs=0"], {}, "max_num_seqs", id="invalid-config"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ours(argv, env)


def test_upstreams_first_simulator_args() -> None:
    """GIE's sim-deployment.yaml (llm-d-inference-sim v0.1.x)."""
    argv = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--max-loras", "2",
            "--max-cpu-loras", "2", "--lora", "food-review-1"]  # fmt: skip
    options = llmd_options(argv, {"EPP_HARNESS_POD_IP": "127.0.3.4"})
    assert options.config.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert options.config.lora_adapters == ("food-review-1",)
    assert options.config.max_loras == 2
    assert (options.host, options.port, options.admin_port) == ("127.0.3.4", 8000, 18000)


def test_later_simulator_args_with_lora_modules_and_fake_metrics() -> None:
    argv = ["--model", "Qwen/Qwen3-32B", "--port=8001", "--render-url", "http://localhost:8082",
            "--lora-modules", '{"name": "food-review-1"}', "b=/adapters/b", "--served-model-name", "qwen",
            "--fake-metrics", '{"waiting-requests": 4, "kv-cache-usage": 0.3}', "--enable-kvcache",
            "--kv-cache-size", "64", "-v", "4"]  # fmt: skip
    options = llmd_options(argv, {"VLLM_SIM_TIME_SCALE": "0.1"})
    assert options.config.model == "qwen", "the served name is what clients ask for"
    assert options.config.lora_adapters == ("food-review-1", "b")
    assert options.config.num_gpu_blocks == 64
    assert options.config.time_scale == 0.1
    assert options.port == 8001
    assert options.pinned == {"waiting": 4.0, "kv_cache": 0.3}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--no-such-flag", "1"], "unknown flag: --no-such-flag", id="unknown"),
        pytest.param(["--port"], "needs an argument", id="no-value"),
        pytest.param(["--port", "eighty"], "invalid flag value", id="bad-value"),
        pytest.param(["--lora-modules", "{not json"], "not JSON", id="bad-module"),
        pytest.param(["stray"], "unexpected argument", id="positional"),
    ],
)
def test_what_the_real_binary_refuses_fails_the_container(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError, match=message):
        llmd_options(argv, {})
