"""Run simulators from sync code: one background thread with its own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

from harness.base.lifecycle import StartStop
from harness.sim._server import ModelServerSim

DEFAULT_STARTUP_TIMEOUT_S = 10.0
DEFAULT_STOP_TIMEOUT_S = 10.0

T = TypeVar("T")


class SimThread(StartStop):
    """Serves one or more ``ModelServerSim`` from a background thread.

    ``start()`` returns once every simulator listens (or re-raises why one could not);
    ``stop()`` stops them, closes the loop and joins the thread. Usable as a context manager.
    """

    def __init__(self, *sims: ModelServerSim, startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S) -> None:
        if not sims:
            raise ValueError("SimThread needs at least one simulator")
        self.sims = sims
        self._startup_timeout = startup_timeout
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None

    @property
    def sim(self) -> ModelServerSim:
        return self.sims[0]

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the simulators' own loop and wait for its result.

        For work that must share the loop with the simulators: reading engine state between steps,
        or a load generator that should not pay a thread hop per request.
        """
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the simulator thread is not running")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("SimThread already started")
        return super().start()

    def _start(self) -> None:
        name = "sim-" + ",".join(s.address for s in self.sims)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(self._startup_timeout):
            raise TimeoutError(f"simulators did not start within {self._startup_timeout}s")
        if self._error is not None:
            raise RuntimeError(f"simulator thread {name} failed to start") from self._error

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        thread = self._thread
        if thread is None:
            return
        loop, stop_event = self._loop, self._stop_event
        if loop is not None and stop_event is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stop_event.set)
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"simulator thread {thread.name} did not stop within {timeout}s")
        self._thread = None

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:  # reported to start(); nothing else owns this thread
            if not self._ready.is_set():
                self._error = err
                self._ready.set()

    async def _serve(self) -> None:
        self._stop_event = asyncio.Event()
        started: list[ModelServerSim] = []
        try:
            for sim in self.sims:
                await sim.start()
                started.append(sim)
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            await self._stop_event.wait()
        finally:
            for sim in reversed(started):
                await sim.stop()
            self._loop = None
