"""The simulated engine: vLLM V1's scheduling loop over simulated time.

One task (``Engine._loop``, started by the first request and ending when idle) runs engine steps. A
step, as in vLLM V1's scheduler:
1. running requests first, in admission order: a request still prefilling gets its next chunk; a
   decoding request gets one token, which may need a new KV block; when no block is free the most
   recently admitted running request is preempted (recompute: its blocks are freed, it goes back to
   the head of the queue and later prefills prompt + generated tokens again), counted in
   ``vllm:num_preemptions``;
2. then, if nothing was preempted, waiting requests in FIFO order while a running slot and token
   budget remain: a request whose LoRA adapter cannot get a slot is skipped (vLLM does so); one whose
   blocks do not fit stops admission (head of line). Admission looks the prompt's block-aligned
   prefix up in the prefix cache (hits are not prefilled again) and loads the adapter if needed.
The step lasts the step-time model of ``SimConfig`` (prefill cost grows with uncached prompt tokens,
decode cost with the batch and its context, plus adapter loads); at its end every decoding request
has one more token and every request whose prefill completed has its first one. A finished request
releases its blocks; its full prompt blocks stay in the prefix cache until evicted.

Simulated time and the event loop's clock are locked together through ``time_scale``; with
``time_scale=0`` steps run back to back and only simulated time passes (unit tests).
Everything runs on one event loop and needs no locks.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence

from harness.sim._config import MAX_LORA_INFO_SERIES, SimConfig
from harness.sim._kv import BlockPool, blocks_for

# How far (simulated seconds) the step loop may fall behind the wall clock and still catch up.
MAX_CATCH_UP_S = 0.05
MAX_RECENT_TTFTS = 100_000


@dataclasses.dataclass(frozen=True)
class EngineState:
    """A point-in-time copy of the engine's real state."""

    waiting: int
    running: int
    kv_cache_usage: float
    running_loras: tuple[str, ...]
    waiting_loras: tuple[str, ...]
    loaded_loras: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Counters:
    """Cumulative engine counters (the counter families of ``/metrics``)."""

    preemptions: int
    prefix_queries: int  # prompt tokens looked up in the prefix cache
    prefix_hits: int  # of which were cached
    # Simulated seconds of steps (GPU time), and how much simulated time was lost because the host
    # was too busy to run the step loop on time (0 on an unloaded machine; large means CPU-bound).
    busy_s: float = 0.0
    late_s: float = 0.0
    lora_loads: int = 0
    # Time to first token as the engine sees it (arrival at the server to first token), summed.
    ttft_sum_s: float = 0.0
    first_tokens: int = 0
    # How far behind the wall clock the step loop ran while it caught up (within MAX_CATCH_UP_S, so
    # not in `late_s`), times each step's duration, summed: / `busy_s` is the mean lag, simulated
    # seconds. The engine's own timeline keeps to simulated time, but whoever watches it (scrapes,
    # the proxy, the client) sees each step that much late.
    behind_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Timings:
    """Simulated seconds spent by one finished request, for the latency histograms."""

    queue_s: float
    prefill_s: float
    decode_s: float
    inter_token_s: tuple[float, ...]

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.prefill_s

    @property
    def e2e_s(self) -> float:
        return self.queue_s + self.prefill_s + self.decode_s


@dataclasses.dataclass(eq=False)
class _Request:
    lora: str | None
    prompt_tokens: int
    max_tokens: int
    block_hashes: tuple[int, ...]
    arrival: float
    # Resolved at first admission (None for a request the virtual-time driver steps: nobody awaits it).
    admitted: asyncio.Future[None] | None
    tokens_ready: asyncio.Event | None  # None when nobody awaits the tokens (the virtual-time driver)
    tag: object = None  # the virtual-time driver's handle, handed back by `end_step`
    running: bool = False  # in `Engine._running` (a flag: list membership costs O(batch))
    admitted_at: float | None = None  # first admission (simulated time)
    generated: int = 0
    # Tokens whose KV is computed; the prefill of this admission ends at `prefill_target`.
    computed: int = 0
    prefill_target: int = 0
    private_blocks: int = 0
    cached: list[int] = dataclasses.field(default_factory=list)  # referenced prefix-cache blocks
    token_times: list[float] = dataclasses.field(default_factory=list)
    preemptions: int = 0
    done: bool = False

    @property
    def blocks(self) -> int:
        return self.private_blocks + len(self.cached)

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prefill_target


@dataclasses.dataclass
class _Step:
    prefill: list[tuple[_Request, int]] = dataclasses.field(default_factory=list)
    decode: list[_Request] = dataclasses.field(default_factory=list)
    lora_loads: int = 0
    context: int = 0  # tokens of context attended to: computed + new tokens of every request

    @property
    def requests(self) -> list[_Request]:
        return [r for r, _ in self.prefill] + self.decode


class Engine:
    """Queue, KV, prefix-cache and LoRA bookkeeping and the step loop of one simulated vLLM."""

    def __init__(self, config: SimConfig, wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._wall_clock = wall_clock
        self._waiting: collections.deque[_Request] = collections.deque()
        self._running: list[_Request] = []
        self._pool = BlockPool(config.num_gpu_blocks, prefix_caching=config.enable_prefix_caching)
        # Loaded adapters, least recently used first.
        self._loaded: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._running_per_lora: collections.Counter[str] = collections.Counter()
        # (running, waiting) label values of vllm:lora_requests_info -> unix time last entered.
        self._lora_series: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()
        self._preemptions = 0
        self._busy_s = 0.0
        self._late_s = 0.0
        self._behind_s = 0.0
        self._lora_loads = 0
        self._ttft_sum_s = 0.0
        self._first_tokens = 0
        # TTFTs since the last reset (server side: arrival to first token), for benchmark percentiles.
        self._recent_ttfts: collections.deque[float] = collections.deque(maxlen=MAX_RECENT_TTFTS)
        self._time_scale = config.time_scale
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._task: asyncio.Task[None] | None = None
        self._step: _Step | None = None
        self._wake: asyncio.Future[None] | None = None
        # Simulated clock: with time_scale > 0 it is the loop clock since `_origin`, scaled.
        self._origin: float | None = None
        self._sim_clock = 0.0
        self._record_lora_state()

    # ---- state read by /metrics, the oracle and tests ------------------------------------------
    def state(self) -> EngineState:
        return EngineState(
            waiting=len(self._waiting),
            running=len(self._running),
            kv_cache_usage=self._pool.usage,
            running_loras=self._running_loras(),
            waiting_loras=self._waiting_loras(),
            loaded_loras=tuple(self._loaded),
        )

    def counters(self) -> Counters:
        return Counters(
            self._preemptions,
            self._prefix_queries,
            self._prefix_hits,
            self._busy_s,
            self._late_s,
            self._lora_loads,
            self._ttft_sum_s,
            self._first_tokens,
            self._behind_s,
        )

    def recent_ttfts(self) -> tuple[float, ...]:
        """Simulated TTFTs (arrival at this server to first token) of the requests since ``reset``."""
        return tuple(self._recent_ttfts)

    def lora_series(self) -> list[tuple[str, str, float]]:
        """Every (running, waiting, last-update time) label set seen, oldest first."""
        return [(run, wait, ts) for (run, wait), ts in self._lora_series.items()]

    def now(self) -> float:
        """Simulated seconds."""
        scale = self._time_scale
        if scale <= 0:
            return self._sim_clock
        loop_time = asyncio.get_running_loop().time()
        if self._origin is None:
            self._origin = loop_time
        return (loop_time - self._origin) / scale

    def estimate_ttft(
        self, *, lora: str | None, prompt_tokens: int, block_hashes: Sequence[int], in_transit: int = 0
    ) -> float:
        """Simulated seconds until a request submitted now would get its first token (the oracle's view).

        Uses what only the engine knows: the remaining output of every running request. A slot frees
        when a running request finishes; the request waits for as many slot releases as there are
        requests queued before it, then for the prefill of the queued prompts and its own (minus
        cached blocks), plus an adapter load when its adapter is not loaded. ``in_transit`` requests
        were sent here but have not arrived yet; they count as queued ones of this prompt's size.
        """
        cfg = self.config
        running = len(self._running)
        step = cfg.step_base_s + cfg.decode_token_s * max(1, running)
        ahead = len(self._waiting) + in_transit
        free_slots = cfg.max_num_seqs - running
        wait = 0.0
        if ahead >= free_slots:
            remaining = sorted(r.max_tokens - r.generated for r in self._running)
            index = ahead - free_slots
            if index < len(remaining):
                wait = remaining[index] * step
            else:  # more queued than running: whole generations pass
                rounds, rest = divmod(index, max(1, len(remaining)))
                mean = sum(remaining) / max(1, len(remaining)) if remaining else 0.0
                wait = (rounds * mean + (remaining[rest] if remaining else 0)) * step
        queued_prefill = sum(r.prompt_tokens + r.generated for r in self._waiting)
        queued_prefill += in_transit * prompt_tokens
        cached = self._pool.match(block_hashes) * cfg.block_size
        own = max(1, prompt_tokens - cached)
        load = cfg.lora_load_s if lora is not None and lora not in self._loaded else 0.0
        return wait + cfg.prefill_token_s * (queued_prefill + own) + cfg.step_base_s + load

    # ---- request lifecycle ------------------------------------------------------------------
    def submit(
        self,
        *,
        lora: str | None,
        prompt_tokens: int,
        max_tokens: int,
        block_hashes: Sequence[int] = (),
    ) -> Run:
        """Queue a request; ``await run.next_token()`` until it returns None, then ``run.close()``."""
        loop = asyncio.get_running_loop()
        full_blocks = prompt_tokens // self.config.block_size
        req = _Request(
            lora=lora,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            block_hashes=tuple(block_hashes)[:full_blocks],
            arrival=self.now(),
            admitted=loop.create_future(),
            tokens_ready=asyncio.Event(),
        )
        self._waiting.append(req)
        self._record_lora_state()
        if self._task is None:
            self._task = loop.create_task(self._loop(), name="sim-engine")
        else:
            self._interrupt_idle_wait()
        return Run(self, req)

    # ---- stepping from outside: the virtual-time driver (harness.cli.bench.virtual) ---------------
    # The same scheduling, KV, prefix-cache and LoRA code as the step loop above, driven by a
    # discrete-event loop instead of asyncio: `enqueue` a request at a simulated time, `begin_step`
    # when the engine is idle or its previous step ended, `end_step` at the time `begin_step` gave.
    # Needs `time_scale=0` (simulated time is whatever the driver says).
    def enqueue(
        self,
        *,
        lora: str | None,
        prompt_tokens: int,
        max_tokens: int,
        block_hashes: Sequence[int] = (),
        now: float,
        tag: object = None,
    ) -> Run:
        """Queue a request that arrived at simulated time ``now``; ``tag`` comes back from ``end_step``."""
        if self._time_scale > 0:
            raise RuntimeError("an engine stepped from outside needs time_scale=0")
        full_blocks = prompt_tokens // self.config.block_size
        req = _Request(
            lora=lora,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            block_hashes=tuple(block_hashes[:full_blocks]),
            arrival=now,
            admitted=None,
            tokens_ready=None,
            tag=tag,
        )
        self._waiting.append(req)
        return Run(self, req)

    def begin_step(self, now: float) -> float | None:
        """Schedule one step starting at ``now``; the simulated time it ends, or None if nothing can run."""
        if self._step is not None:
            raise RuntimeError("a step is already under way")
        self._sim_clock = max(self._sim_clock, now)
        step = self._schedule()
        if not step.requests:
            return None
        self._step = step
        duration = self._duration(step)
        self._busy_s += duration
        return self._sim_clock + duration

    def end_step(self, end: float) -> tuple[list[object], list[object]]:
        """Finish the step ``begin_step`` started: the tags of the requests that got their first token
        in it, and of those that finished."""
        step, self._step = self._step, None
        if step is None:
            raise RuntimeError("no step is under way")
        self._sim_clock = end
        fresh = [r for r, _ in step.prefill if r.generated == 0]
        finished = self._complete(step, end)
        return [r.tag for r in fresh if r.generated > 0], [r.tag for r in finished]

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    def _close(self, req: _Request) -> None:
        if req.done:
            return
        req.done = True
        if req.running:
            self._release(req)
            self._running.remove(req)
            req.running = False
        elif req in self._waiting:
            self._waiting.remove(req)
        if req.admitted is not None and not req.admitted.done():
            req.admitted.cancel()
        if req.tokens_ready is not None:
            req.tokens_ready.set()
        self._record_lora_state()
        step = self._step
        if step is not None and all(r.done for r in step.requests):
            self._interrupt_step()  # the whole batch went away: no reason to sleep out the step
        else:
            self._interrupt_idle_wait()

    async def aclose(self) -> None:
        """Stop the step loop (server shutdown); requests still inside get no more tokens."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise

    def reset(self, time_scale: float | None = None) -> None:
        """Back to a cold start: empty prefix cache, no adapter loaded, counters kept. Must be idle.

        ``time_scale`` changes how fast simulated time runs from now on (simulated time stays
        continuous), e.g. to measure capacity slower than the benchmark runs.
        """
        if self._running or self._waiting:
            raise RuntimeError("reset needs an idle engine")
        self._pool.reset()
        self._loaded.clear()
        self._recent_ttfts.clear()
        self._record_lora_state()
        if time_scale is not None and time_scale != self._time_scale:
            if time_scale <= 0 or self._time_scale <= 0:
                raise ValueError("the time scale can only change between positive values")
            now = self.now()
            self._time_scale = time_scale
            self._origin = asyncio.get_running_loop().time() - now * time_scale

    @property
    def time_scale(self) -> float:
        return self._time_scale

    # ---- the step loop -------------------------------------------------------------------------
    async def _loop(self) -> None:
        # Steps follow each other in simulated time: a step starts where the previous one ended, so a
        # wake-up that comes a little late (timer granularity, a busy host) is caught up by the next
        # sleep instead of stretching simulated time. Only when the loop falls behind by more than
        # MAX_CATCH_UP_S does simulated time give way (counted in `late_s`).
        resume: float | None = None
        try:
            while self._running or self._waiting:
                step = self._schedule()
                if not step.requests:
                    resume = None
                    await self._idle_wait()
                    continue
                now = self.now()
                start = resume if resume is not None and now - resume < MAX_CATCH_UP_S else now
                if resume is not None:
                    self._late_s += max(0.0, start - resume)
                end = start + self._duration(step)
                self._step = step
                try:
                    await self._sleep_until(end)
                finally:
                    self._step = None
                self._busy_s += end - start
                self._behind_s += max(0.0, now - start) * (end - start)
                resume = end
                self._complete(step, end)
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    def _schedule(self) -> _Step:
        cfg = self.config
        step = _Step()
        budget = cfg.max_num_batched_tokens
        preemptions_before = self._preemptions
        index = 0
        running = self._running  # (preemption removes from this same list)
        block_size = cfg.block_size
        decode = step.decode
        context = 0  # tokens of context the step's attention reads (see _duration)
        # The hot loop of a virtual-time run (every running request, every step): attributes read
        # once, and "needs a new block" as one comparison (blocks_for(computed + 1) > blocks).
        while index < len(running) and budget > 0:
            req = running[index]
            computed = req.computed
            if computed < req.prefill_target:
                chunk = min(req.prefill_target - computed, budget)
                step.prefill.append((req, chunk))
                context += computed + chunk
                budget -= chunk
                index += 1
                continue
            if computed >= (req.private_blocks + len(req.cached)) * block_size and not self._grow(req):
                continue  # it was the newest running request and preempted itself
            decode.append(req)
            context += computed + 1
            budget -= 1
            index += 1
        if self._preemptions > preemptions_before and step.requests:
            return step  # as vLLM: no admissions in a step that had to preempt
        while self._waiting and len(self._running) < cfg.max_num_seqs and budget > 0:
            candidate = self._pick_waiting()
            if candidate is None:
                break
            req = candidate
            loads = self._admit(req)
            if loads is None:
                break
            step.lora_loads += loads
            chunk = min(req.prefill_target - req.computed, budget)
            step.prefill.append((req, chunk))
            context += req.computed + chunk
            budget -= chunk
        step.context = context
        self._record_lora_state()
        return step

    def _grow(self, req: _Request) -> bool:
        """One more block for a decoding request, preempting the newest running ones to free it.

        False when ``req`` itself had to go, or when nothing else can be preempted (a request alone
        with the whole cache then simply keeps decoding in the blocks it has).
        """
        while not self._pool.allocate(1):
            victim = self._running[-1]
            if victim is req and len(self._running) == 1:
                return True  # alone and out of blocks: let it run on capped
            self._preempt(victim)
            if victim is req:
                return False
        req.private_blocks += 1
        return True

    def _preempt(self, req: _Request) -> None:
        self._release(req)
        self._running.remove(req)
        req.running = False
        req.computed = 0
        req.prefill_target = 0
        req.preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(req)

    def _pick_waiting(self) -> _Request | None:
        """The first waiting request whose adapter can run now (vLLM skips the others)."""
        for req in self._waiting:
            if self._lora_admissible(req.lora):
                return req
        return None

    def _admit(self, req: _Request) -> int | None:
        """Allocate blocks and start the (re)computation; the adapter loads it costs, None if no room."""
        cfg = self.config
        target = req.prompt_tokens + req.generated
        # Whole blocks only, and never the last token: at least one token is computed to sample from.
        matched = min(self._pool.match(req.block_hashes), (target - 1) // cfg.block_size)
        cached_tokens = matched * cfg.block_size
        need = blocks_for(target, cfg.block_size) - matched
        hits = req.block_hashes[:matched]
        self._pool.acquire_cached(hits)  # before allocating, so the hits are not evicted for it
        if not self._pool.allocate(need):
            if self._running:
                self._pool.release(0, hits)
                return None
            # Larger than the whole cache and nothing else runs: it runs alone in what there is.
            need = self._pool.available
            self._pool.allocate(need)
        req.cached = list(hits)
        req.private_blocks = need
        req.computed = cached_tokens
        req.prefill_target = target
        self._prefix_queries += target
        self._prefix_hits += cached_tokens
        self._waiting.remove(req)
        self._running.append(req)
        req.running = True
        loads = 0
        if req.lora is not None:
            if req.lora in self._loaded:
                self._loaded.move_to_end(req.lora)
            else:
                if len(self._loaded) >= cfg.max_loras:
                    idle = next(name for name in self._loaded if name not in self._running_per_lora)
                    del self._loaded[idle]
                self._loaded[req.lora] = None
                self._lora_loads += 1
                loads = 1
            self._running_per_lora[req.lora] += 1
        if req.admitted_at is None:
            req.admitted_at = self.now()
            if req.admitted is not None:
                req.admitted.set_result(None)
        return loads

    def _release(self, req: _Request) -> None:
        self._pool.release(req.private_blocks, req.cached)
        req.private_blocks = 0
        req.cached = []
        if req.lora is not None:
            self._running_per_lora[req.lora] -= 1
            if self._running_per_lora[req.lora] <= 0:
                del self._running_per_lora[req.lora]

    def _duration(self, step: _Step) -> float:
        cfg = self.config
        prefill_tokens = sum(n for _, n in step.prefill)
        context = step.context
        return (
            cfg.step_base_s
            + cfg.prefill_token_s * prefill_tokens
            + cfg.decode_token_s * len(step.decode)
            + cfg.context_token_s * context
            + cfg.lora_load_s * step.lora_loads
        )

    def _complete(self, step: _Step, now: float) -> list[_Request]:
        finished: list[_Request] = []
        for req, chunk in step.prefill:
            if req.done or not req.running:
                continue
            req.computed += chunk
            if not req.prefilling:
                self._publish_prompt_blocks(req)
                self._emit(req, now, finished)
        for req in step.decode:
            if req.done or not req.running:
                continue
            req.computed += 1
            generated = req.generated
            if generated == 0 or req.tokens_ready is not None:
                self._emit(req, now, finished)
                continue
            # `_emit` inlined for the common case of the virtual-time driver's decode tokens.
            req.generated = generated + 1
            req.token_times.append(now)
            if generated + 1 >= req.max_tokens:
                finished.append(req)
        for req in finished:
            req.done = True
            req.running = False
            self._release(req)
            if req.tokens_ready is not None:
                req.tokens_ready.set()
        if finished:
            self._running = [r for r in self._running if r.running]
            self._record_lora_state()
        return finished

    def _emit(self, req: _Request, now: float, finished: list[_Request]) -> None:
        if req.generated == 0:
            ttft = max(0.0, now - req.arrival)
            self._ttft_sum_s += ttft
            self._first_tokens += 1
            self._recent_ttfts.append(ttft)
        req.generated += 1
        req.token_times.append(now)
        if req.tokens_ready is not None:
            req.tokens_ready.set()
        if req.generated >= req.max_tokens:
            finished.append(req)

    def _publish_prompt_blocks(self, req: _Request) -> None:
        """After a prefill, its full prompt blocks become prefix-cache entries."""
        for h in req.block_hashes[len(req.cached) :]:
            if req.private_blocks == 0 or not self._pool.publish(h):
                break
            req.private_blocks -= 1
            req.cached.append(h)

    # ---- waiting --------------------------------------------------------------------------------
    async def _sleep_until(self, end: float) -> None:
        scale = self._time_scale
        if scale <= 0:
            self._sim_clock = end
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        assert self._origin is not None  # set by now()
        target = self._origin + end * scale
        if target <= loop.time():
            await asyncio.sleep(0)
            return
        wake = self._wake = loop.create_future()
        handle = loop.call_at(target, _resolve, wake)
        try:
            await wake
        finally:
            handle.cancel()
            self._wake = None

    async def _idle_wait(self) -> None:
        """Nothing can run (every waiting adapter blocked): wait for a request to arrive or leave."""
        wake = self._wake = asyncio.get_running_loop().create_future()
        try:
            await wake
        finally:
            self._wake = None

    def _interrupt_step(self) -> None:
        if self._wake is not None:
            _resolve(self._wake)

    def _interrupt_idle_wait(self) -> None:
        if self._step is None and self._wake is not None:
            _resolve(self._wake)

    # ---- LoRA bookkeeping ---------------------------------------------------------------------
    def _lora_admissible(self, lora: str | None) -> bool:
        if lora is None or lora in self._loaded or len(self._loaded) < self.config.max_loras:
            return True
        return any(name not in self._running_per_lora for name in self._loaded)

    def _running_loras(self) -> tuple[str, ...]:
        return tuple(sorted(self._running_per_lora))

    def _waiting_loras(self) -> tuple[str, ...]:
        return tuple(sorted({r.lora for r in self._waiting if r.lora is not None}))

    def _record_lora_state(self) -> None:
        key = (",".join(self._running_loras()), ",".join(self._waiting_loras()))
        if self._lora_series and next(reversed(self._lora_series)) == key:
            return
        self._lora_series.pop(key, None)
        self._lora_series[key] = self._wall_clock()
        while len(self._lora_series) > MAX_LORA_INFO_SERIES:
            self._lora_series.popitem(last=False)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Run:
    """One request inside the engine. Always ``close()`` it (the server does so in ``finally``)."""

    def __init__(self, engine: Engine, req: _Request) -> None:
        self._engine = engine
        self._req = req
        self._consumed = 0

    @property
    def generated(self) -> int:
        return self._req.generated

    @property
    def max_tokens(self) -> int:
        return self._req.max_tokens

    @property
    def admitted(self) -> bool:
        return self._req.admitted_at is not None

    @property
    def running(self) -> bool:
        """Inside the running batch now (false while queued, after a preemption, and when done)."""
        return self._req.running

    @property
    def preemptions(self) -> int:
        return self._req.preemptions

    async def wait_admitted(self) -> None:
        admitted = self._req.admitted
        if admitted is None:
            raise RuntimeError("a request stepped by the virtual-time driver has no admission to await")
        await asyncio.shield(admitted)

    async def next_token(self) -> int | None:
        """Wait for the next token; its index, or None when the request is done."""
        req = self._req
        ready = req.tokens_ready
        if ready is None:
            raise RuntimeError("a request stepped by the virtual-time driver has no tokens to await")
        while self._consumed >= req.generated:
            if req.done:
                return None
            ready.clear()
            await ready.wait()
        self._consumed += 1
        return self._consumed - 1

    def timings(self) -> Timings:
        req = self._req
        times = req.token_times
        # A step may start a moment before `now` while the loop catches up (Engine._loop): clamp.
        admitted = max(req.admitted_at, req.arrival) if req.admitted_at is not None else req.arrival
        first = max(times[0], admitted) if times else admitted
        return Timings(
            queue_s=admitted - req.arrival,
            prefill_s=first - admitted,
            decode_s=(times[-1] - first) if times else 0.0,
            inter_token_s=tuple(b - a for a, b in itertools.pairwise(times)),
        )

    def close(self) -> None:
        self._engine._close(self._req)
