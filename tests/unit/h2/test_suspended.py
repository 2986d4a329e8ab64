"""Handlers that suspend (await) before they answer: what they answer, or how they fail, after
resuming reaches the client exactly as if they had answered at once; a bare yield (no future, as
`asyncio.sleep(0)` gives) is a suspension too."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from epp.h2 import frames as f
from epp.h2.connection import Limits, StreamError

from .support import Script, Wire, frames_in


def test_a_handler_that_gives_way_to_the_loop_once_answers_after_it() -> None:
    asyncio.run(_test_a_handler_that_gives_way_to_the_loop_once_answers_after_it())


async def _test_a_handler_that_gives_way_to_the_loop_once_answers_after_it() -> None:
    wire = Wire()
    sid = wire.open()
    wire.send(sid, b"yield-1", b"two", end=True)
    wire.pump()
    await wire.settle()
    assert wire.results[sid].replies == [b"re:yield-1", b"re:two"]
    assert wire.results[sid].status == 0


@pytest.mark.parametrize(
    ("failure", "status", "message"),
    [
        pytest.param(lambda: StreamError(5, "gone meanwhile"), 5, "gone meanwhile", id="stream-error"),
        pytest.param(lambda: RuntimeError("kaput"), 2, "Unexpected RuntimeError: kaput", id="unexpected"),
    ],
)
def test_a_handler_that_fails_after_resuming_ends_its_stream_with_its_status(
    failure: Callable[[], BaseException], status: int, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="epp.h2.connection"):
        asyncio.run(_fails_after_resuming(failure, status, message))
    if status != 2:
        assert caplog.records == []  # a StreamError is the handler's answer, not a failure
        return
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("a gRPC stream handler failed:\nTraceback (most recent call last):\n  File ")
    assert message.endswith("RuntimeError: kaput\n")


async def _fails_after_resuming(failure: Callable[[], BaseException], status: int, message: str) -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate, fail_on={b"wait": failure}))
    sid = wire.open()
    wire.send(sid, b"wait", b"never handled")
    wire.pump()
    gate.set_result(None)
    await wire.settle()
    result = wire.results[sid]
    assert (result.status, result.message) == (status, message)
    assert wire.recorder.handlers[0].messages == [b"wait"]
    assert wire.recorder.handlers[0].closed == 1
    assert wire.server.open_streams == 0
    other = wire.open()
    wire.send(other, b"end")
    wire.pump()
    assert wire.results[other].replies == [b"re:end"]  # the connection serves on


@pytest.mark.parametrize("ended_by", ["the-peer", "a-queued-message"])
def test_messages_queued_behind_a_suspended_handle_are_credited_once_and_nothing_after_the_end(
    ended_by: str,
) -> None:
    asyncio.run(_queued_behind_a_suspended_handle(ended_by))


async def _queued_behind_a_suspended_handle(ended_by: str) -> None:
    """Whether the peer ends the stream or a queued message does (the peer still sending), every
    byte of the queued messages is credited to the connection once, and the stream, once ended, is
    sent no more window."""
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate), Limits(stream_window=65_535))
    sid = wire.open()
    queued = [b"two" * 100, b"three" * 8_000]  # past half the stream window: its credit would be due
    wire.send(sid, b"wait", *queued, b"end", end=ended_by == "the-peer")
    wire.pump()
    before = wire.transport.mark()
    gate.set_result(None)
    await wire.settle()
    result = wire.results[sid]
    assert result.replies == [b"re:wait", *(b"re:" + m for m in queued), b"re:end"]
    assert (result.status, wire.server.open_streams) == (0, 0)
    inflow = wire.server._inflow
    assert inflow.held == 0  # every byte credited back or owed, none lost
    frames = frames_in(wire.transport.since(before))
    ended_at = next(
        i for i, (kind, flags, stream, _) in enumerate(frames) if stream == sid and flags & f.END_STREAM
    )  # the trailers
    assert [
        kind for kind, _, stream, _ in frames[ended_at + 1 :] if stream == sid and kind == f.WINDOW_UPDATE
    ] == []
