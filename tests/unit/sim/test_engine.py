"""The simulated engine: admission, KV blocks, preemption, prefix cache, LoRA slots, step-time model.

time_scale=0 runs engine steps back to back in simulated time only, so these tests are exact and
fast. Between two steps the engine yields to the loop once: a test that has just received a token
sees the state with the next step already planned (blocks for it allocated).
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from harness.sim import SimConfig
from harness.sim._engine import Engine, Run
from harness.sim._kv import block_hashes

pytestmark = pytest.mark.anyio

# Round numbers so timings can be checked exactly.
TIMING = {
    "step_base_s": 0.01,
    "prefill_token_s": 0.001,
    "decode_token_s": 0.002,
    "context_token_s": 0.0,
    "lora_load_s": 0.5,
}
# Holds the loop up for less than the engine's catch-up allowance (MAX_CATCH_UP_S, 50 ms), with room
# to spare for a busy host.
HOLD_S = 0.025


def engine(**overrides: object) -> Engine:
    settings: dict[str, object] = {"model": "base", "lora_adapters": ("a", "b", "c"), "time_scale": 0.0}
    settings.update(overrides)
    return Engine(SimConfig(**settings))  # type: ignore[arg-type]


def submit(
    eng: Engine,
    lora: str | None = None,
    prompt_tokens: int = 1,
    max_tokens: int = 1,
    prompt: str | None = None,
) -> Run:
    hashes = block_hashes(list(prompt), eng.config.block_size, lora) if prompt is not None else ()
    return eng.submit(lora=lora, prompt_tokens=prompt_tokens, max_tokens=max_tokens, block_hashes=hashes)


async def drain(run: Run) -> list[int]:
    tokens = []
    while (index := await asyncio.wait_for(run.next_token(), timeout=10)) is not None:
        tokens.append(index)
    run.close()
    return tokens


async def admitted(run: Run) -> None:
    await asyncio.wait_for(run.wait_admitted(), timeout=5)


@pytest.fixture
async def closing() -> list[Engine]:
    engines: list[Engine] = []
    yield engines  # type: ignore[misc]
    for eng in engines:
        await eng.aclose()


async def test_admits_up_to_max_num_seqs_in_fifo_order(closing: list[Engine]) -> None:
    eng = engine(max_num_seqs=2)
    closing.append(eng)
    runs = [submit(eng, max_tokens=1000) for _ in range(4)]
    await runs[0].next_token()
    assert [r.admitted for r in runs] == [True, True, False, False]
    assert (eng.state().running, eng.state().waiting) == (2, 2)

    runs[1].close()
    await admitted(runs[2])
    assert not runs[3].admitted
    runs[0].close()
    await admitted(runs[3])
    assert (eng.state().running, eng.state().waiting) == (2, 0)
    for run in runs:
        run.close()


async def test_closing_a_queued_request_removes_it_from_the_queue(closing: list[Engine]) -> None:
    eng = engine(max_num_seqs=1)
    closing.append(eng)
    first, queued, last = submit(eng, max_tokens=1000), submit(eng), submit(eng)
    await first.next_token()
    queued.close()
    assert eng.state().waiting == 1
    first.close()
    assert await drain(last) == [0]
    assert not queued.admitted
    assert eng.state().waiting == 0


async def test_a_prompt_whose_blocks_do_not_fit_holds_the_head_of_the_queue(closing: list[Engine]) -> None:
    # 4 blocks of 16 tokens; admission takes the prompt's blocks, decoding takes more as it goes.
    eng = engine(num_gpu_blocks=4, block_size=16)
    closing.append(eng)
    big = submit(eng, prompt_tokens=48, max_tokens=2)  # 3 blocks
    second = submit(eng, prompt_tokens=32, max_tokens=1)  # 2 more: does not fit
    small = submit(eng, prompt_tokens=1, max_tokens=1)  # would fit, but FIFO keeps it behind
    await big.next_token()
    assert (big.admitted, second.admitted, small.admitted) == (True, False, False)
    assert await drain(big) == [1]
    assert await drain(second) == [0]
    assert await drain(small) == [0]


async def test_kv_blocks_are_allocated_as_tokens_are_generated(closing: list[Engine]) -> None:
    eng = engine(num_gpu_blocks=10, block_size=16)
    closing.append(eng)
    run = submit(eng, prompt_tokens=10, max_tokens=40)
    seen = []
    while await run.next_token() is not None:
        seen.append(eng.state().kv_cache_usage)
    run.close()
    assert seen[0] == pytest.approx(0.1)  # the prompt's block (the next token still fits in it)
    *decoding, last = seen
    assert decoding == sorted(decoding)  # grows block by block
    assert max(decoding) == pytest.approx(0.4)  # 10 prompt + 39 fed-back tokens = 49 tokens = 4 blocks
    assert last == 0.0  # the last token finished it and freed its blocks


async def test_out_of_blocks_the_newest_request_is_preempted_requeued_and_finishes(
    closing: list[Engine],
) -> None:
    # Two requests that each grow to 4 blocks share a 4-block cache.
    eng = engine(num_gpu_blocks=4, block_size=16, max_num_seqs=4)
    closing.append(eng)
    older = submit(eng, prompt_tokens=16, max_tokens=40)
    newer = submit(eng, prompt_tokens=16, max_tokens=40)
    older_tokens, newer_tokens = await asyncio.gather(drain(older), drain(newer))
    assert older_tokens == list(range(40))
    assert newer_tokens == list(range(40))  # recomputed after preemption, no token lost or repeated
    assert older.preemptions == 0
    assert newer.preemptions >= 1
    assert eng.counters().preemptions == newer.preemptions
    assert eng.state() == eng.state().__class__(0, 0, 0.0, (), (), ())


async def test_preempted_request_waits_in_the_queue_while_the_older_one_runs(closing: list[Engine]) -> None:
    eng = engine(num_gpu_blocks=4, block_size=16, max_num_seqs=4)
    closing.append(eng)
    older = submit(eng, prompt_tokens=16, max_tokens=60)
    newer = submit(eng, prompt_tokens=16, max_tokens=60)
    while newer.preemptions == 0:
        await older.next_token()
    assert not newer.running
    assert (eng.state().running, eng.state().waiting) == (1, 1)
    older.close()
    assert await drain(newer) == list(range(60))


async def test_a_request_larger_than_the_cache_runs_alone(closing: list[Engine]) -> None:
    eng = engine(num_gpu_blocks=4, block_size=16)
    closing.append(eng)
    small = submit(eng, max_tokens=1000)
    huge = submit(eng, prompt_tokens=10_000, max_tokens=3)
    await small.next_token()
    assert not huge.admitted
    small.close()
    await huge.next_token()
    assert eng.state().kv_cache_usage == 1.0
    assert await drain(huge) == [1, 2]


async def test_prefix_hit_skips_the_cached_blocks_of_the_prefill(closing: list[Engine]) -> None:
    eng = engine(block_size=16, **TIMING)
    closing.append(eng)
    prompt = "x" * 160  # 10 full blocks of one-character tokens
    first = submit(eng, prompt_tokens=160, prompt=prompt)
    await drain(first)
    again = submit(eng, prompt_tokens=160, prompt=prompt)
    await drain(again)
    other_adapter = submit(eng, lora="a", prompt_tokens=160, prompt=prompt)
    await drain(other_adapter)

    assert first.timings().ttft_s == pytest.approx(0.01 + 160 * 0.001)
    # All 10 blocks cached, but the last token is always computed: 9 blocks hit, 16 tokens prefilled.
    assert again.timings().ttft_s == pytest.approx(0.01 + 16 * 0.001)
    # The adapter salts the hashes: no hit (and its load costs 0.5 s).
    assert other_adapter.timings().ttft_s == pytest.approx(0.01 + 160 * 0.001 + 0.5)
    counters = eng.counters()
    assert (counters.prefix_queries, counters.prefix_hits) == (480, 144)


async def test_cached_blocks_are_evicted_least_recently_used_first(closing: list[Engine]) -> None:
    eng = engine(num_gpu_blocks=4, block_size=16, **TIMING)
    closing.append(eng)
    a, b = "a" * 32, "b" * 32
    for prompt in (a, b):  # 2 + 2 cached blocks fill the cache
        await drain(submit(eng, prompt_tokens=32, prompt=prompt))
    await drain(submit(eng, prompt_tokens=32, prompt=a))  # a is now the most recently used
    c = submit(eng, prompt_tokens=32, prompt="c" * 32)  # needs 2 blocks: evicts b
    await drain(c)
    hit_a = submit(eng, prompt_tokens=32, prompt=a)
    await drain(hit_a)
    miss_b = submit(eng, prompt_tokens=32, prompt=b)
    await drain(miss_b)
    assert hit_a.timings().ttft_s == pytest.approx(0.01 + 16 * 0.001)
    assert miss_b.timings().ttft_s == pytest.approx(0.01 + 32 * 0.001)


async def test_prefill_cost_grows_with_prompt_tokens_and_decode_with_the_batch(
    closing: list[Engine],
) -> None:
    eng = engine(max_num_seqs=4, **TIMING)
    closing.append(eng)
    alone = submit(eng, prompt_tokens=10, max_tokens=3)
    await drain(alone)
    longer = submit(eng, prompt_tokens=100, max_tokens=1)
    await drain(longer)
    assert alone.timings().prefill_s == pytest.approx(0.01 + 10 * 0.001)
    assert longer.timings().prefill_s == pytest.approx(0.01 + 100 * 0.001)
    assert alone.timings().inter_token_s == pytest.approx((0.01 + 0.002, 0.01 + 0.002))

    batch = [submit(eng, max_tokens=4) for _ in range(4)]
    await asyncio.gather(*(drain(r) for r in batch))
    # After the shared prefill step, every step decodes 4 tokens.
    assert batch[0].timings().inter_token_s == pytest.approx((0.01 + 4 * 0.002,) * 3)


async def test_decode_step_grows_with_the_context_it_attends_to(closing: list[Engine]) -> None:
    eng = engine(**{**TIMING, "context_token_s": 0.0001})
    closing.append(eng)
    run = submit(eng, prompt_tokens=100, max_tokens=3)
    await drain(run)
    # Second token: context 101 (prompt + first token); third: 102.
    assert run.timings().inter_token_s == pytest.approx(
        (0.01 + 0.002 + 101 * 0.0001, 0.01 + 0.002 + 102 * 0.0001)
    )


async def test_long_prompts_are_prefilled_in_chunks_of_the_token_budget(closing: list[Engine]) -> None:
    eng = engine(max_num_batched_tokens=64, **TIMING)
    closing.append(eng)
    run = submit(eng, prompt_tokens=150, max_tokens=1)
    await drain(run)
    # Three steps: 64 + 64 + 22 prompt tokens, each paying the step base.
    assert run.timings().prefill_s == pytest.approx(3 * 0.01 + 150 * 0.001)


async def test_lora_request_waits_for_a_slot_then_evicts_the_idle_adapter(closing: list[Engine]) -> None:
    eng = engine(max_num_seqs=4, max_loras=1)
    closing.append(eng)
    a = submit(eng, lora="a", max_tokens=1000)
    b = submit(eng, lora="b")
    base = submit(eng)  # the blocked adapter request does not hold up the base model
    await a.next_token()
    await base.next_token()
    assert (a.admitted, b.admitted) == (True, False)
    state = eng.state()
    assert (state.running_loras, state.waiting_loras, state.loaded_loras) == (("a",), ("b",), ("a",))

    a.close()
    await drain(b)
    assert eng.state().loaded_loras == ("b",)
    base.close()


async def test_loading_an_adapter_costs_its_step_once(closing: list[Engine]) -> None:
    eng = engine(max_loras=2, **TIMING)
    closing.append(eng)
    cold = submit(eng, lora="a", prompt_tokens=10)
    await drain(cold)
    warm = submit(eng, lora="a", prompt_tokens=10)
    await drain(warm)
    assert cold.timings().ttft_s == pytest.approx(0.01 + 10 * 0.001 + 0.5)
    assert warm.timings().ttft_s == pytest.approx(0.01 + 10 * 0.001)


async def test_lora_eviction_picks_the_least_recently_used_idle_adapter(closing: list[Engine]) -> None:
    eng = engine(max_loras=2)
    closing.append(eng)
    for lora in ("a", "b", "a"):  # a is now more recently used than b
        await drain(submit(eng, lora=lora))
    assert eng.state().loaded_loras == ("b", "a")
    await drain(submit(eng, lora="c"))
    assert eng.state().loaded_loras == ("a", "c")


async def test_lora_series_records_each_state_change_with_its_time(closing: list[Engine]) -> None:
    clock = itertools.count(100)
    eng = Engine(
        SimConfig(model="base", lora_adapters=("a", "b"), max_loras=1, time_scale=0.0), lambda: next(clock)
    )
    closing.append(eng)
    a = submit(eng, lora="a", max_tokens=1000)
    b = submit(eng, lora="b")
    await a.next_token()
    a.close()
    await drain(b)
    assert [(run, wait) for run, wait, _ in eng.lora_series()] == [
        ("", "a"),
        ("", "a,b"),  # both queued before the first step
        ("a", "b"),
        ("", "b"),  # a closed; b is loaded at the next step
        ("b", ""),
        ("", ""),  # back to idle: the old idle series moves to the end with a new time
    ]
    times = [ts for _, _, ts in eng.lora_series()]
    assert times == sorted(times)


async def test_reset_empties_the_prefix_cache_and_unloads_adapters(closing: list[Engine]) -> None:
    eng = engine(max_loras=2, **TIMING)
    closing.append(eng)
    await drain(submit(eng, lora="a", prompt_tokens=32, prompt="p" * 32))
    eng.reset()
    again = submit(eng, lora="a", prompt_tokens=32, prompt="p" * 32)
    await drain(again)
    assert again.timings().ttft_s == pytest.approx(0.01 + 32 * 0.001 + 0.5)


async def test_oracle_estimate_grows_with_the_work_ahead(closing: list[Engine]) -> None:
    eng = engine(max_num_seqs=1, **TIMING)
    closing.append(eng)
    idle = eng.estimate_ttft(lora=None, prompt_tokens=10, block_hashes=())
    busy = submit(eng, max_tokens=100)
    await busy.next_token()
    loaded = eng.estimate_ttft(lora=None, prompt_tokens=10, block_hashes=())
    cold_adapter = eng.estimate_ttft(lora="a", prompt_tokens=10, block_hashes=())
    busy.close()
    assert idle == pytest.approx(0.01 + 10 * 0.001)
    assert loaded > idle + 90 * 0.01  # waits for ~99 more decode steps of the running request
    assert cold_adapter == pytest.approx(loaded + 0.5)


async def test_steps_run_behind_the_wall_clock_while_catching_up_are_counted_apart_from_lag(
    closing: list[Engine],
) -> None:
    """A loop held up for less than the catch-up allowance (MAX_CATCH_UP_S) loses no simulated time,
    so `late_s` cannot show it; the steps that follow ran behind the wall clock, and `behind_s` says
    by how much (each step's lag times its duration)."""
    eng = engine(time_scale=1.0, **TIMING)  # one simulated second per wall second; 12 ms decode steps
    closing.append(eng)
    run = submit(eng, max_tokens=30)
    await run.next_token()
    time.sleep(HOLD_S)  # noqa: ASYNC251 - on purpose: the loop is held up, no step can start on time
    await drain(run)
    counters = eng.counters()
    step = TIMING["step_base_s"] + TIMING["decode_token_s"]
    # The step due during the hold starts at least HOLD_S - step behind (more if the host adds to it).
    assert counters.behind_s >= (HOLD_S - step) / 2 * step, counters
    assert counters.busy_s > 0
