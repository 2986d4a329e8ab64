"""The simulated engine's bookkeeping: slots, FIFO queue, KV budget, LoRA LRU, latency model.

time_scale=0 makes every simulated sleep instant, so these tests drive the engine step by step.
"""

from __future__ import annotations

import itertools

import pytest

from harness.sim import SimConfig
from harness.sim._engine import Engine, Run

pytestmark = pytest.mark.anyio


def engine(**overrides: object) -> Engine:
    settings: dict[str, object] = {"model": "base", "lora_adapters": ("a", "b", "c"), "time_scale": 0.0}
    settings.update(overrides)
    return Engine(SimConfig(**settings))  # type: ignore[arg-type]


def submit(eng: Engine, lora: str | None = None, prompt_tokens: int = 1, max_tokens: int = 1) -> Run:
    return eng.submit(lora=lora, prompt_tokens=prompt_tokens, max_tokens=max_tokens)


async def drain(run: Run) -> None:
    while await run.next_token() is not None:
        pass


async def test_admits_up_to_max_num_seqs_in_fifo_order() -> None:
    eng = engine(max_num_seqs=2)
    runs = [submit(eng) for _ in range(4)]
    assert [r.admitted for r in runs] == [True, True, False, False]
    assert (eng.state().running, eng.state().waiting) == (2, 2)

    runs[1].close()
    assert [r.admitted for r in runs] == [True, True, True, False]
    runs[0].close()
    assert runs[3].admitted
    assert (eng.state().running, eng.state().waiting) == (2, 0)


async def test_closing_a_queued_request_removes_it_from_the_queue() -> None:
    eng = engine(max_num_seqs=1)
    first, queued, last = submit(eng), submit(eng), submit(eng)
    queued.close()
    assert eng.state().waiting == 1
    first.close()
    assert last.admitted
    assert not queued.admitted
    assert eng.state().waiting == 0


async def test_kv_budget_blocks_the_head_of_the_queue() -> None:
    # 4 blocks of 16 tokens; a request reserves blocks for prompt + max_tokens.
    eng = engine(max_num_seqs=8, num_gpu_blocks=4, block_size=16)
    big = submit(eng, prompt_tokens=32, max_tokens=16)  # 3 blocks
    second = submit(eng, prompt_tokens=32, max_tokens=16)  # 3 more: does not fit
    small = submit(eng, prompt_tokens=1, max_tokens=1)  # would fit, but FIFO keeps it behind
    assert (big.admitted, second.admitted, small.admitted) == (True, False, False)
    big.close()
    assert second.admitted
    assert small.admitted


async def test_kv_usage_counts_prompt_and_generated_tokens() -> None:
    eng = engine(num_gpu_blocks=10, block_size=16)
    run = submit(eng, prompt_tokens=16, max_tokens=32)
    assert eng.state().kv_cache_usage == pytest.approx(0.1)  # the prompt's block
    for _ in range(17):
        await run.next_token()
    assert eng.state().kv_cache_usage == pytest.approx(0.3)  # ceil(33 / 16) blocks
    run.close()
    assert eng.state().kv_cache_usage == 0.0


async def test_request_larger_than_the_cache_runs_alone() -> None:
    eng = engine(num_gpu_blocks=4, block_size=16)
    small = submit(eng)
    huge = submit(eng, prompt_tokens=10_000)
    assert not huge.admitted
    small.close()
    assert huge.admitted
    assert eng.state().kv_cache_usage == 1.0


async def test_lora_request_waits_for_a_slot_then_evicts_the_idle_adapter() -> None:
    eng = engine(max_num_seqs=4, max_loras=1)
    a = submit(eng, lora="a")
    b = submit(eng, lora="b")
    base = submit(eng)  # the blocked adapter request does not hold up the base model
    assert (a.admitted, b.admitted, base.admitted) == (True, False, True)
    state = eng.state()
    assert (state.running_loras, state.waiting_loras, state.loaded_loras) == (("a",), ("b",), ("a",))

    a.close()
    state = eng.state()
    assert b.admitted
    assert (state.running_loras, state.waiting_loras, state.loaded_loras) == (("b",), (), ("b",))


async def test_lora_eviction_picks_the_least_recently_used_idle_adapter() -> None:
    eng = engine(max_loras=2)
    submit(eng, lora="a").close()
    submit(eng, lora="b").close()
    submit(eng, lora="a").close()  # a is now more recently used than b
    assert eng.state().loaded_loras == ("b", "a")
    c = submit(eng, lora="c")
    assert c.admitted
    assert eng.state().loaded_loras == ("a", "c")


async def test_lora_series_records_each_state_change_with_its_time() -> None:
    clock = itertools.count(100)
    eng = Engine(
        SimConfig(model="base", lora_adapters=("a", "b"), max_loras=1, time_scale=0.0), lambda: next(clock)
    )
    a = submit(eng, lora="a")
    b = submit(eng, lora="b")
    a.close()
    b.close()
    assert eng.lora_series() == [
        ("a", "", 101),
        ("a", "b", 102),
        ("b", "", 103),
        ("", "", 104),  # back to idle: the old idle series moves to the end with a new time
    ]


async def test_inter_token_latency_rises_with_the_batch() -> None:
    eng = engine(max_num_seqs=3, itl_s=0.01, load_factor=3.0, ttft_base_s=0.05, prefill_per_token_s=0.001)
    alone = submit(eng, prompt_tokens=10, max_tokens=3)
    await drain(alone)
    alone.close()
    timings = alone.timings()
    assert timings.prefill_s == pytest.approx(0.05 + 10 * 0.001)
    assert timings.inter_token_s == pytest.approx((0.01, 0.01))

    batch = [submit(eng, max_tokens=3) for _ in range(3)]
    await drain(batch[0])
    assert batch[0].timings().inter_token_s == pytest.approx((0.03, 0.03))
