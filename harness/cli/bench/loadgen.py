"""Replay a trace against a router in real time, streaming, and time every token the client sees.

Open loop: request i is sent at ``start + at_i * time_scale`` whatever happened to the earlier ones
(as inference-perf's Poisson stages do), so a slow policy builds queues instead of slowing the load.
Every request streams (``stream: true``); the client timestamps each SSE chunk as it arrives, so TTFT
and inter-token gaps are what a user of that router would measure. Times are wall seconds here;
the report divides them by the time scale to express them in simulated seconds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from harness.cli.bench.workload import TraceRequest

# A request that has not finished after this many wall seconds counts as an error (a hung router).
DEFAULT_REQUEST_TIMEOUT_S = 120.0
_DATA = b"data: "
_DONE = b"data: [DONE]"


@dataclass
class Outcome:
    """What the client saw of one request (wall seconds, from the moment it was sent)."""

    index: int
    status: int = 0  # HTTP status; 0 when no response came back
    ttft: float | None = None
    e2e: float | None = None
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)  # between consecutive token chunks
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.tokens > 0 and not self.error


@dataclass(frozen=True)
class Target:
    """Where one request goes and which model name its body carries."""

    url: str  # the completions URL
    model: str
    headers: tuple[tuple[str, str], ...] = ()


Router = Callable[[TraceRequest], Awaitable[Target]]
Finished = Callable[[TraceRequest, Target, Outcome], None]


def completion_body(request: TraceRequest, model: str) -> bytes:
    body = {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    return json.dumps(body).encode()


async def replay(
    requests: Sequence[TraceRequest],
    route: Router,
    *,
    time_scale: float,
    on_done: Finished | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> list[Outcome]:
    """Send every request at its offset, wait for all, return outcomes in trace order."""
    loop = asyncio.get_running_loop()
    outcomes = [Outcome(r.index) for r in requests]
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = loop.time() + 0.05
        tasks: list[asyncio.Task[None]] = []
        for request, outcome in zip(requests, outcomes, strict=True):
            delay = start + request.at * time_scale - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(loop.create_task(_one(session, request, route, outcome, on_done)))
        await asyncio.gather(*tasks)
    return outcomes


async def _one(
    session: aiohttp.ClientSession,
    request: TraceRequest,
    route: Router,
    outcome: Outcome,
    on_done: Finished | None,
) -> None:
    loop = asyncio.get_running_loop()
    target: Target | None = None
    sent = loop.time()
    try:
        target = await route(request)
        sent = loop.time()
        body = completion_body(request, target.model)
        headers = {"Content-Type": "application/json", **dict(target.headers)}
        async with session.post(target.url, data=body, headers=headers) as response:
            outcome.status = response.status
            if response.status != 200:
                await response.read()
                return
            last = sent
            async for chunk in response.content.iter_any():
                events = chunk.count(_DATA) - chunk.count(_DONE)
                if events <= 0:
                    continue
                now = loop.time()
                if outcome.tokens == 0:
                    outcome.ttft = now - sent
                else:
                    outcome.gaps.append(now - last)
                if events > 1:  # several tokens in one read: the client saw them at once
                    outcome.gaps.extend([0.0] * (events - 1))
                outcome.tokens += events
                last = now
            outcome.e2e = loop.time() - sent
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        if on_done is not None and target is not None:
            on_done(request, target, outcome)
