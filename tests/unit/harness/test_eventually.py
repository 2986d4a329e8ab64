"""eventually / eventually_async: retry on AssertionError only, return the value, explain a timeout."""

from __future__ import annotations

import asyncio

import pytest

from harness.eventually import eventually, eventually_async


class Counter:
    def __init__(self, succeed_on: int) -> None:
        self.calls = 0
        self.succeed_on = succeed_on

    def __call__(self) -> str:
        self.calls += 1
        assert self.calls >= self.succeed_on, f"only {self.calls} calls"
        return "done"


def test_returns_the_value_once_the_assertion_holds() -> None:
    counter = Counter(succeed_on=3)
    assert eventually(counter, timeout=5, interval=0.001) == "done"
    assert counter.calls == 3


def test_timeout_reraises_the_last_assertion_with_context() -> None:
    counter = Counter(succeed_on=10**9)
    with pytest.raises(
        AssertionError, match=r"pods ready: still failing after .* attempts\): only \d+ calls"
    ) as info:
        eventually(counter, timeout=0.05, interval=0.01, message="pods ready")
    assert isinstance(info.value.__cause__, AssertionError)
    assert counter.calls >= 2


def test_other_exceptions_propagate_at_once() -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        eventually(broken, timeout=5)
    assert calls == [1]


def test_async_variant_awaits_coroutine_functions() -> None:
    counter = Counter(succeed_on=2)

    async def check() -> str:
        return counter()

    assert asyncio.run(eventually_async(check, timeout=5, interval=0.001)) == "done"
    assert counter.calls == 2


def test_async_variant_times_out_with_the_last_assertion() -> None:
    counter = Counter(succeed_on=10**9)

    async def check() -> str:
        return counter()

    with pytest.raises(AssertionError, match=r"still failing after .*: only \d+ calls"):
        asyncio.run(eventually_async(check, timeout=0.05, interval=0.01))
