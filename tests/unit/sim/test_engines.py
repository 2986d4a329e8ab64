"""The simulator poses as vLLM, SGLang or trtllm-serve: each engine's gauge names on /metrics, read
back by the EPP's parser with that engine's names (and not with another's)."""

from __future__ import annotations

import pytest

from epp.backend.metrics.parse import parse
from epp.config import ProberConfig
from epp.datastore.types import Metrics
from harness.sim import ModelServerSim, SimConfig
from harness.sim._cli import build_parser, config_from, sim_args

from .scrape import families

pytestmark = pytest.mark.anyio

ENGINES = ["vllm", "sglang", "trtllm-serve"]


@pytest.mark.parametrize("engine", ENGINES)
async def test_each_engine_publishes_its_names_and_the_epp_reads_them(address: str, engine: str) -> None:
    config = SimConfig(model="base", engine=engine, time_scale=0.001)
    async with ModelServerSim(address, config=config) as sim:
        sim.set_gauges(waiting=3, running=2, kv_cache=0.4)
        page = sim.metrics_text()
    names = ProberConfig().names_for(engine)
    metrics, errors = parse(page, names, Metrics(), now=1.0)
    assert (metrics.waiting_queue_size, metrics.running_queue_size, metrics.kv_cache_usage) == (3, 2, 0.4)
    assert not errors, errors
    fams = families(page)
    for other in ENGINES:
        if other == engine:
            continue
        other_names = ProberConfig().names_for(other)
        assert other_names.queued_requests not in fams
        assert other_names.kv_cache_usage not in fams


async def test_sglang_and_trtllm_publish_their_kv_geometry(address: str) -> None:
    for engine, name in (
        ("sglang", "sglang:cache_config_info"),
        ("trtllm-serve", "trtllm_kv_cache_max_blocks"),
    ):
        config = SimConfig(model="base", engine=engine, num_gpu_blocks=77, block_size=16, time_scale=0.001)
        async with ModelServerSim(address, config=config) as sim:
            fams = families(sim.metrics_text())
        assert name in fams, engine
        assert "vllm:lora_requests_info" not in fams


def test_engine_flag_and_environment_round_trip() -> None:
    parser = build_parser()
    assert config_from(parser.parse_args(["--engine", "sglang"]), {}).engine == "sglang"
    assert config_from(parser.parse_args([]), {"VLLM_SIM_ENGINE": "trtllm-serve"}).engine == "trtllm-serve"
    assert sim_args(SimConfig(engine="sglang")) == ["--engine=sglang"]
    with pytest.raises(ValueError, match="engine must be one of"):
        SimConfig(engine="tgi")
