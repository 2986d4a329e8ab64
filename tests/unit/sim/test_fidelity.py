"""The calibrated engine stays within +-20% of its published references (harness.sim.fidelity), and
the stepping API the virtual-time benchmark drives gives the same times as the step model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.sim import Engine, h100_llama_8b
from harness.sim.fidelity import TOLERANCE, fidelity, run_alone


def test_every_fidelity_point_is_within_its_bound() -> None:
    points = fidelity()
    assert len(points) == 9
    for p in points:
        got, want = p.simulated_s * 1e3, p.reference_s * 1e3
        assert abs(p.error) <= TOLERANCE, f"{p.figure}: {got:.2f} ms vs {want:.2f} ms"


def test_a_slower_decode_step_is_caught() -> None:
    slow = h100_llama_8b(time_scale=0.0, decode_token_s=60e-6)
    missed = [p.figure for p in fidelity(slow) if not p.holds]
    assert "TPOT, batch 128" in missed


def test_the_preset_has_vllm_v1_defaults() -> None:
    cfg = h100_llama_8b()
    assert (cfg.max_num_seqs, cfg.block_size, cfg.max_loras, cfg.enable_prefix_caching) == (256, 16, 1, True)
    assert 20_000 < cfg.num_gpu_blocks < 35_000  # ~430k tokens of KV on an 80 GB card


def test_stepping_from_outside_reports_first_tokens_and_finishes() -> None:
    cfg = h100_llama_8b(time_scale=0.0)
    engine = Engine(cfg, wall_clock=lambda: 0.0)
    engine.enqueue(lora=None, prompt_tokens=100, max_tokens=2, now=0.0, tag="a")
    end = engine.begin_step(0.0)
    assert end == pytest.approx(cfg.step_base_s + cfg.prefill_token_s * 100 + cfg.context_token_s * 100)
    first, finished = engine.end_step(end)
    assert (first, finished) == (["a"], [])
    second = engine.begin_step(end)
    assert second is not None
    assert engine.end_step(second) == ([], ["a"])
    assert engine.idle
    assert engine.begin_step(second) is None


def test_an_asyncio_engine_cannot_be_stepped_from_outside() -> None:
    engine = Engine(replace(h100_llama_8b(), time_scale=1.0))
    with pytest.raises(RuntimeError, match="time_scale=0"):
        engine.enqueue(lora=None, prompt_tokens=1, max_tokens=1, now=0.0)


def test_run_alone_drains_a_batch() -> None:
    engine = Engine(h100_llama_8b(time_scale=0.0), wall_clock=lambda: 0.0)
    runs = [engine.enqueue(lora=None, prompt_tokens=64, max_tokens=8, now=0.0) for _ in range(3)]
    run_alone(engine)
    assert all(r.generated == 8 for r in runs)
