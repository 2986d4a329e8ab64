"""Shared bits of the watch-layer tests: a task-leak-checking runner and recording fakes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, TypeVar

from epp.k8s.client import WatchEvent
from epp.k8s.config import KubeConfig

T = TypeVar("T")

WAIT = 10.0  # safety net for awaits that must complete; never a sleep


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run(main()) and fail if main left any task behind (STYLE habit 6)."""

    async def checked() -> T:
        result = await main()
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        assert not leftover, f"tasks left behind: {[t.get_name() for t in leftover]}"
        return result

    return asyncio.run(checked())


async def drain(stream: AsyncGenerator[WatchEvent, None], into: list[WatchEvent] | None = None) -> None:
    """Read a watch to its end (into `into`, when given), closing it whatever happens."""
    async with contextlib.aclosing(stream):
        async for event in stream:
            if into is not None:
                into.append(event)


def plain_config(url: str, token: str = "") -> KubeConfig:
    return KubeConfig(server=url, ssl_context=None, token=token)


class RecordingSleep:
    """Injected instead of asyncio.sleep: records each delay and yields once, so time never passes."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


class BlockingSleep(RecordingSleep):
    """Records the delay, then never returns: the caller stays in its backoff until cancelled."""

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.Event().wait()


class Timer:
    def __init__(self, delay: float, callback: Callable[[], None]) -> None:
        self.delay = delay
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimers:
    """A call_later that only records; the test decides when a retry fires."""

    def __init__(self) -> None:
        self.timers: list[Timer] = []

    def __call__(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(delay, callback)
        self.timers.append(timer)
        return timer

    def fire_all(self) -> None:
        pending = [t for t in self.timers if not t.cancelled]
        self.timers = []
        for timer in pending:
            timer.callback()
