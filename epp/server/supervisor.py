"""One owner for every top-level task of the EPP (STYLE habit 6).

Each task has a name. Top-level tasks are meant to run until shutdown, so one that ends, whether it
raised or returned, is a failure: the supervisor cancels all the others at once and `wait()` raises
`TaskFailed` naming it. `stop()` cancels every task, awaits them all, then runs the registered
cleanups in reverse order of registration. Nothing here is restartable: one supervisor, one life.
(After controller-runtime's runnable group and kopf's task guards.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskFailed(RuntimeError):
    """A supervised task ended before shutdown; `__cause__` is its exception, if it raised one."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"task {name!r} {detail}")
        self.name = name


class Supervisor:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cleanups: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        self._failure: TaskFailed | None = None
        self._stopping = False
        self._stopped = False
        self._wake = asyncio.Event()
        self._failed = asyncio.Event()

    @property
    def failure(self) -> TaskFailed | None:
        return self._failure

    @property
    def task_names(self) -> frozenset[str]:
        return frozenset(name for name, task in self._tasks.items() if not task.done())

    def spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        if self._stopping:
            coro.close()
            raise RuntimeError(f"supervisor is stopping; not starting {name!r}")
        if name in self._tasks:
            coro.close()
            raise ValueError(f"a task named {name!r} already exists")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks[name] = task
        task.add_done_callback(lambda t: self._on_done(name, t))

    def on_stop(self, name: str, cleanup: Callable[[], Awaitable[None]]) -> None:
        """Run `cleanup` during `stop()`, after every task has finished (last registered runs first)."""
        self._cleanups.append((name, cleanup))

    def request_stop(self) -> None:
        """Wake `wait()` without a failure (a signal handler calls this); `stop()` does the work."""
        self._wake.set()

    async def wait(self) -> None:
        """Until a task fails (raises TaskFailed) or `request_stop()`/`stop()` is called."""
        await self._wake.wait()
        if self._failure is not None:
            raise self._failure

    async def wait_failure(self) -> TaskFailed:
        """Until a task fails (not merely until a stop is requested): what a drain watches for."""
        await self._failed.wait()
        assert self._failure is not None
        return self._failure

    async def stop(self) -> None:
        """Cancel every task, await them all, then run the cleanups. Safe to call more than once."""
        if self._stopped:
            return
        self._stopping = True
        self._wake.set()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        # A finished task keeps its exception, whose traceback keeps every frame (and every server
        # object those frames reference) alive: forget them, so stopped means released.
        self._tasks.clear()
        del tasks
        for name, cleanup in reversed(self._cleanups):
            try:
                await cleanup()
            except Exception:
                log.exception("cleanup %r failed during shutdown", name)
        self._cleanups.clear()
        self._stopped = True

    def _on_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._stopping:
            if not task.cancelled() and task.exception() is not None:
                log.warning("task %r raised while stopping: %r", name, task.exception())
            return
        if task.cancelled():
            failure = TaskFailed(name, "was cancelled from outside the supervisor")
        elif (exc := task.exception()) is not None:
            failure = TaskFailed(name, f"failed: {exc!r}")
            failure.__cause__ = exc
        else:
            failure = TaskFailed(name, "exited unexpectedly")
        log.error("%s; stopping every other task", failure, exc_info=failure.__cause__)
        if self._failure is None:
            self._failure = failure
            self._failed.set()
        self._stopping = True
        for other in self._tasks.values():
            if not other.done():
                other.cancel()
        self._wake.set()
