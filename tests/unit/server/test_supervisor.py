"""The supervisor: one death stops everyone and is surfaced; stop cancels, awaits, then cleans up."""

from __future__ import annotations

import asyncio

import pytest

from epp.server.supervisor import Supervisor, TaskFailed


async def _forever(log: list[str], name: str) -> None:
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        log.append(f"{name} stopped")


def test_stop_cancels_every_task_then_runs_cleanups_in_reverse() -> None:
    log: list[str] = []

    async def scenario() -> None:
        sup = Supervisor()
        sup.spawn("a", _forever(log, "a"))
        sup.spawn("b", _forever(log, "b"))

        async def cleanup(name: str) -> None:
            log.append(f"cleanup {name}")

        sup.on_stop("first", lambda: cleanup("first"))
        sup.on_stop("second", lambda: cleanup("second"))
        await asyncio.sleep(0)
        assert sup.task_names == {"a", "b"}
        await sup.stop()
        assert sup.task_names == frozenset()
        await sup.stop()  # idempotent
        await sup.wait()  # woken, no failure

    asyncio.run(scenario())
    assert sorted(log[:2]) == ["a stopped", "b stopped"]
    assert log[2:] == ["cleanup second", "cleanup first"]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        pytest.param("raise", "failed: RuntimeError('boom')", id="raises"),
        pytest.param("return", "exited unexpectedly", id="returns"),
    ],
)
def test_one_task_ending_stops_the_others_and_is_surfaced(body: str, detail: str) -> None:
    log: list[str] = []

    async def dies() -> None:
        await asyncio.sleep(0)
        if body == "raise":
            raise RuntimeError("boom")

    async def scenario() -> None:
        sup = Supervisor()
        sup.spawn("steady", _forever(log, "steady"))
        sup.spawn("fragile", dies())
        with pytest.raises(TaskFailed) as info:
            await sup.wait()
        assert info.value.name == "fragile"
        assert detail in str(info.value)
        assert sup.failure is info.value
        await sup.stop()
        with pytest.raises(RuntimeError, match="stopping"):
            sup.spawn("late", _forever(log, "late"))

    asyncio.run(scenario())
    assert log == ["steady stopped"]


def test_failing_cleanup_does_not_skip_the_rest() -> None:
    ran: list[str] = []

    async def bad() -> None:
        raise OSError("close failed")

    async def good() -> None:
        ran.append("good")

    async def scenario() -> None:
        sup = Supervisor()
        sup.on_stop("good", good)
        sup.on_stop("bad", bad)
        await sup.stop()

    asyncio.run(scenario())
    assert ran == ["good"]


def test_duplicate_names_are_refused() -> None:
    async def scenario() -> None:
        sup = Supervisor()
        sup.spawn("x", _forever([], "x"))
        with pytest.raises(ValueError, match="already exists"):
            sup.spawn("x", _forever([], "x"))
        await sup.stop()

    asyncio.run(scenario())
