"""Closed-loop HTTP load: N clients, each sending its next request as soon as the last one ended,
so exactly N requests are in flight the whole time. What a fault test needs to count the requests a
fault costs: every outcome is kept with its start and end time.

It runs on a background thread with its own event loop (aiohttp), so a synchronous test can inject
the fault while the load runs: `with ClosedLoopLoad(url, body, concurrency=32) as load: ...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self

import aiohttp

from harness.base.lifecycle import StartStop

_STOP_TIMEOUT_S = 120.0
_ERROR_TEXT_CHARS = 300


@dataclass(frozen=True)
class Outcome:
    """One request: monotonic start and end, the HTTP status (None: no answer), what went wrong."""

    started: float
    ended: float
    status: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


class ClosedLoopLoad(StartStop):
    """`concurrency` clients POSTing `body(i)` (JSON) to `url` until `stop()`."""

    def __init__(
        self,
        url: str,
        body: Callable[[int], Mapping[str, Any]],
        *,
        concurrency: int = 32,
        timeout_s: float = 60.0,
    ) -> None:
        self.url = url
        self.body = body
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self._outcomes: list[Outcome] = []
        self._lock = threading.Lock()  # guards _outcomes (the load's thread appends, tests read)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ reading
    def outcomes(self, since: float = 0.0) -> list[Outcome]:
        """Finished requests that started at or after `since` (monotonic), in the order they ended."""
        with self._lock:
            return [o for o in self._outcomes if o.started >= since]

    def failures(self, since: float = 0.0) -> list[Outcome]:
        return [o for o in self.outcomes(since) if not o.ok]

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("the load is already running")
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="closed-loop", daemon=True)
        self._thread.start()
        ready.wait(10.0)
        return self

    def stop(self) -> list[Outcome]:
        """Stop sending, let the requests in flight end, join the thread; every outcome."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return self.outcomes()
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopping.set)
        thread.join(_STOP_TIMEOUT_S)
        if thread.is_alive():
            raise TimeoutError("the load's requests did not end")
        self._thread = None
        if self._error is not None:
            raise RuntimeError("the load generator failed") from self._error
        return self.outcomes()

    # ------------------------------------------------------------------ on the load's loop
    def _main(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._run(ready))
        except BaseException as exc:
            self._error = exc
        finally:
            ready.set()

    async def _run(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            ready.set()
            async with asyncio.TaskGroup() as group:
                for client in range(self.concurrency):
                    group.create_task(self._client(session, client))

    async def _client(self, session: aiohttp.ClientSession, client: int) -> None:
        assert self._stopping is not None
        while not self._stopping.is_set():
            started = time.monotonic()
            status: int | None = None
            error = ""
            try:
                async with session.post(self.url, json=self.body(client)) as response:
                    status = response.status
                    text = await response.text()
                    if status != 200:
                        error = text[:_ERROR_TEXT_CHARS]
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = repr(exc)[:_ERROR_TEXT_CHARS]
            with self._lock:
                self._outcomes.append(Outcome(started, time.monotonic(), status, error))
