"""The simulated engine: running slots, a FIFO waiting queue, a KV block budget and LoRA slots.

Everything here runs on one event loop and needs no locks. The engine owns the state the
``/metrics`` page reports; the latency model lives in ``Run``.

Admission (run whenever a request arrives or leaves), in FIFO order over the waiting queue:
- no running slot free: stop;
- the request's LoRA adapter cannot get a slot (all ``max_loras`` slots hold adapters that running
  requests use): skip it and look at the next request, as vLLM does;
- the KV blocks for the whole request (prompt + max_tokens) are not free: stop (head of line);
- otherwise admit it: load its adapter if needed (evicting the least recently used idle one) and
  reserve its blocks. ``kv_cache_usage_perc`` reports the blocks actually filled so far
  (prompt + generated tokens), so it grows while a request decodes.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import time
from collections.abc import Callable

from harness.sim._config import MAX_LORA_INFO_SERIES, SimConfig

# Sleeps shorter than this are accumulated and taken together (the loop's clock is ~1 ms).
_MIN_SLEEP_S = 0.002


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
    need_blocks: int
    arrival: float
    admitted: asyncio.Future[None]
    admitted_at: float | None = None
    generated: int = 0


class Engine:
    """Queue, KV and LoRA bookkeeping of one simulated vLLM instance."""

    def __init__(self, config: SimConfig, wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._wall_clock = wall_clock
        self._waiting: collections.deque[_Request] = collections.deque()
        self._running: list[_Request] = []
        self._reserved_blocks = 0
        # Loaded adapters, least recently used first.
        self._loaded: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._running_per_lora: collections.Counter[str] = collections.Counter()
        # (running, waiting) label values of vllm:lora_requests_info -> unix time last entered.
        self._lora_series: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()
        self._record_lora_state()

    # ---- state read by /metrics and tests -------------------------------------------------
    def state(self) -> EngineState:
        held = sum(self._held_blocks(r) for r in self._running)
        return EngineState(
            waiting=len(self._waiting),
            running=len(self._running),
            kv_cache_usage=min(1.0, held / self.config.num_gpu_blocks),
            running_loras=self._running_loras(),
            waiting_loras=self._waiting_loras(),
            loaded_loras=tuple(self._loaded),
        )

    def lora_series(self) -> list[tuple[str, str, float]]:
        """Every (running, waiting, last-update time) label set seen, oldest first."""
        return [(run, wait, ts) for (run, wait), ts in self._lora_series.items()]

    # ---- request lifecycle ------------------------------------------------------------------
    def submit(self, *, lora: str | None, prompt_tokens: int, max_tokens: int) -> Run:
        """Queue a request; ``await run.wait_admitted()`` then drive it with ``next_token``."""
        loop = asyncio.get_running_loop()
        need = math.ceil((prompt_tokens + max_tokens) / self.config.block_size)
        req = _Request(
            lora=lora,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            need_blocks=min(need, self.config.num_gpu_blocks),
            arrival=loop.time(),
            admitted=loop.create_future(),
        )
        self._waiting.append(req)
        self._schedule()
        return Run(self, req)

    def _finish(self, req: _Request) -> None:
        if req in self._running:
            self._running.remove(req)
            self._reserved_blocks -= req.need_blocks
            if req.lora is not None:
                self._running_per_lora[req.lora] -= 1
                if self._running_per_lora[req.lora] <= 0:
                    del self._running_per_lora[req.lora]
        elif req in self._waiting:
            self._waiting.remove(req)
        if not req.admitted.done():
            req.admitted.cancel()
        self._schedule()

    # ---- admission ----------------------------------------------------------------------------
    def _schedule(self) -> None:
        kept: collections.deque[_Request] = collections.deque()
        while self._waiting:
            if len(self._running) >= self.config.max_num_seqs:
                break
            req = self._waiting[0]
            if req.admitted.done():  # cancelled while queued; _finish removes it
                kept.append(self._waiting.popleft())
                continue
            if not self._lora_admissible(req.lora):
                kept.append(self._waiting.popleft())
                continue
            if self._reserved_blocks + req.need_blocks > self.config.num_gpu_blocks:
                break
            self._waiting.popleft()
            self._admit(req)
        kept.extend(self._waiting)
        self._waiting = kept
        self._record_lora_state()

    def _lora_admissible(self, lora: str | None) -> bool:
        if lora is None or lora in self._loaded or len(self._loaded) < self.config.max_loras:
            return True
        return any(name not in self._running_per_lora for name in self._loaded)

    def _admit(self, req: _Request) -> None:
        if req.lora is not None:
            if req.lora in self._loaded:
                self._loaded.move_to_end(req.lora)
            else:
                if len(self._loaded) >= self.config.max_loras:
                    idle = next(name for name in self._loaded if name not in self._running_per_lora)
                    del self._loaded[idle]
                self._loaded[req.lora] = None
            self._running_per_lora[req.lora] += 1
        self._reserved_blocks += req.need_blocks
        self._running.append(req)
        req.admitted_at = asyncio.get_running_loop().time()
        req.admitted.set_result(None)

    def _held_blocks(self, req: _Request) -> int:
        filled = math.ceil((req.prompt_tokens + req.generated) / self.config.block_size)
        return min(filled, req.need_blocks)

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

    def _inter_token_latency(self) -> float:
        cfg = self.config
        if cfg.max_num_seqs <= 1:
            return cfg.itl_s * cfg.load_factor
        busy = (len(self._running) - 1) / (cfg.max_num_seqs - 1)
        return cfg.itl_s * (1.0 + (cfg.load_factor - 1.0) * max(0.0, busy))


class Run:
    """One request inside the engine. Always ``close()`` it (the server does so in ``finally``)."""

    def __init__(self, engine: Engine, req: _Request) -> None:
        self._engine = engine
        self._req = req
        self._debt = 0.0
        self._prefill_s = 0.0
        self._inter_token: list[float] = []
        self._closed = False

    @property
    def generated(self) -> int:
        return self._req.generated

    @property
    def max_tokens(self) -> int:
        return self._req.max_tokens

    @property
    def admitted(self) -> bool:
        return self._req.admitted_at is not None

    async def wait_admitted(self) -> None:
        await asyncio.shield(self._req.admitted)

    async def next_token(self) -> int | None:
        """Sleep for the next token's latency; return its index, or None when done."""
        req, cfg = self._req, self._engine.config
        if req.generated >= req.max_tokens:
            return None
        if req.generated == 0:
            delay = cfg.ttft_base_s + cfg.prefill_per_token_s * req.prompt_tokens
            self._prefill_s = delay
        else:
            delay = self._engine._inter_token_latency()
            self._inter_token.append(delay)
        await self._sleep(delay * cfg.time_scale, last=req.generated + 1 >= req.max_tokens)
        req.generated += 1
        return req.generated - 1

    def timings(self) -> Timings:
        req, scale = self._req, self._engine.config.time_scale
        queued = (req.admitted_at - req.arrival) if req.admitted_at is not None else 0.0
        return Timings(
            queue_s=queued / scale if scale > 0 else 0.0,
            prefill_s=self._prefill_s,
            decode_s=sum(self._inter_token),
            inter_token_s=tuple(self._inter_token),
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._engine._finish(self._req)

    async def _sleep(self, seconds: float, *, last: bool) -> None:
        self._debt += seconds
        if self._debt >= _MIN_SLEEP_S or (last and self._debt > 0):
            debt, self._debt = self._debt, 0.0
            await asyncio.sleep(debt)
        else:
            await asyncio.sleep(0)
