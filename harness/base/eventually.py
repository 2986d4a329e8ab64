"""Poll-until-true helpers: the only way tests wait for something (STYLE habit 18: poll, never sleep).

The contract. ``fn`` expresses the condition with plain ``assert`` statements, so on timeout the
caller sees the last assertion message (pytest's rewritten one included) instead of a bare "timed
out". "Not yet" is ``AssertionError``, plus exactly the exception types the caller names in
``retry_on`` as legitimately transient for *this* check (``retry_on=(openai.NotFoundError,)`` while
a model is being created). Anything else propagates at once, because retrying an unexpected error
only hides it — and a check that raises something else while waiting would otherwise decide on its
first attempt without ever polling. ``pytest.raises`` inside ``fn`` is such a trap (its failure is
not an ``AssertionError``): catch the expected error and return it instead.

"Eventually" is for positive checks (something happens). A negative check ("nothing changed") is
settled first, never polled: see ``harness.verdicts.settle``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
DEFAULT_INTERVAL = 0.02

Transient = tuple[type[Exception], ...]


def eventually(
    fn: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    message: str = "",
    retry_on: Transient = (),
) -> T:
    """Call ``fn`` until it returns without ``AssertionError`` (or a ``retry_on`` type); return its value.

    After ``timeout`` seconds the last such error is re-raised as an ``AssertionError`` carrying
    ``message``, the elapsed time and the attempt count (chained, so the original traceback is kept).
    """
    not_yet: Transient = (AssertionError, *retry_on)
    started = time.monotonic()
    deadline = started + timeout
    attempts = 0
    while True:
        attempts += 1
        try:
            return fn()
        except not_yet as exc:
            now = time.monotonic()
            if now >= deadline:
                raise _timeout_error(exc, message, now - started, attempts) from exc
            time.sleep(min(interval, deadline - now))


async def eventually_async(
    fn: Callable[[], Awaitable[T]],
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - same signature as eventually()
    interval: float = DEFAULT_INTERVAL,
    message: str = "",
    retry_on: Transient = (),
) -> T:
    """As ``eventually``, for an async ``fn``; sleeps with ``asyncio.sleep`` between tries."""
    not_yet: Transient = (AssertionError, *retry_on)
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout
    attempts = 0
    while True:
        attempts += 1
        try:
            return await fn()
        except not_yet as exc:
            now = loop.time()
            if now >= deadline:
                raise _timeout_error(exc, message, now - started, attempts) from exc
            await asyncio.sleep(min(interval, deadline - now))


def _timeout_error(last: Exception, message: str, elapsed: float, attempts: int) -> AssertionError:
    prefix = f"{message}: " if message else ""
    detail = str(last) or type(last).__name__
    if not isinstance(last, AssertionError):
        detail = f"{type(last).__name__}: {detail}"
    return AssertionError(f"{prefix}still failing after {elapsed:.2f}s ({attempts} attempts): {detail}")
