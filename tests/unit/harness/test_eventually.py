"""eventually / eventually_async: retry on AssertionError and the named transient errors only, return the
value, explain a timeout."""

from __future__ import annotations

import asyncio

import pytest

from harness.base.eventually import eventually, eventually_async


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


class Transient(Exception):
    pass


def test_named_transient_errors_are_retried_and_reported_on_timeout() -> None:
    calls = []

    def not_there_yet() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Transient("404 model not found")
        return "served"

    assert eventually(not_there_yet, timeout=5, interval=0.001, retry_on=(Transient,)) == "served"
    assert len(calls) == 3

    def never() -> None:
        raise Transient("404 model not found")

    with pytest.raises(
        AssertionError, match=r"model: still failing .*: Transient: 404 model not found"
    ) as info:
        eventually(never, timeout=0.05, interval=0.01, message="model", retry_on=(Transient,))
    assert isinstance(info.value.__cause__, Transient)


def test_a_transient_error_not_named_is_not_retried() -> None:
    """The trap this contract closes: a check raising something else decides on its first attempt."""
    calls = []

    def check() -> None:
        calls.append(1)
        raise Transient("404")

    with pytest.raises(Transient):
        eventually(check, timeout=5, retry_on=(KeyError,))
    assert calls == [1]


def test_async_variant_retries_named_transient_errors() -> None:
    counter = Counter(succeed_on=3)

    async def check() -> str:
        try:
            return counter()
        except AssertionError as exc:
            raise Transient(str(exc)) from exc

    assert asyncio.run(eventually_async(check, timeout=5, interval=0.001, retry_on=(Transient,))) == "done"
