"""Poll-until-true helpers: the only way tests wait for something (STYLE habit 18: poll, never sleep).

``fn`` expresses the condition with plain ``assert`` statements, so on timeout the caller sees the
last assertion message (pytest's rewritten one included) instead of a bare "timed out".
Only ``AssertionError`` means "not yet"; any other exception propagates at once, because retrying
an unexpected error only hides it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
DEFAULT_INTERVAL = 0.02


def eventually(
    fn: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    message: str = "",
) -> T:
    """Call ``fn`` until it returns without ``AssertionError``; return its value.

    After ``timeout`` seconds the last ``AssertionError`` is re-raised, wrapped with ``message``, the
    elapsed time and the attempt count (and chained, so the original traceback is kept).
    """
    started = time.monotonic()
    deadline = started + timeout
    attempts = 0
    while True:
        attempts += 1
        try:
            return fn()
        except AssertionError as exc:
            now = time.monotonic()
            if now >= deadline:
                raise _timeout_error(exc, message, now - started, attempts) from exc
            time.sleep(min(interval, deadline - now))


async def eventually_async(
    fn: Callable[[], Awaitable[T]],
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - same signature as eventually()
    interval: float = DEFAULT_INTERVAL,
    message: str = "",
) -> T:
    """As ``eventually``, for an async ``fn``; sleeps with ``asyncio.sleep`` between tries."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout
    attempts = 0
    while True:
        attempts += 1
        try:
            return await fn()
        except AssertionError as exc:
            now = loop.time()
            if now >= deadline:
                raise _timeout_error(exc, message, now - started, attempts) from exc
            await asyncio.sleep(min(interval, deadline - now))


def _timeout_error(last: AssertionError, message: str, elapsed: float, attempts: int) -> AssertionError:
    prefix = f"{message}: " if message else ""
    detail = str(last) or type(last).__name__
    return AssertionError(f"{prefix}still failing after {elapsed:.2f}s ({attempts} attempts): {detail}")
