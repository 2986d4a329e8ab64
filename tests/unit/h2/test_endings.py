"""How a connection ends, and what it leaves: a stall ends it only while writing is paused; after
an error's GOAWAY nothing the peer sends is served; whichever way it ended, losing the transport
afterwards (asyncio always calls `connection_lost`) raises nothing and leaves no timer armed."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from epp.h2 import frames as f
from epp.h2.connection import Limits
from epp.h2.limits import GOAWAY_GRACE

from .support import Wire, goaway_code, goaway_debug, grpc_message, header_block

IDLE = 30.0


def test_a_stall_ends_the_connection_only_while_writing_stays_paused() -> None:
    wire = Wire(limits=Limits(idle_timeout=IDLE))
    wire.open()  # an open stream: the connection is not idle
    wire.pump()
    wire.server.pause_writing()
    wire.clock.advance(IDLE - 1)
    wire.server.resume_writing()  # the peer read in time
    wire.clock.advance(3 * IDLE)
    assert goaway_code(wire.transport.take()) is None
    assert not wire.transport.closed


def test_an_error_after_writing_resumed_lingers_for_the_goaway_instead_of_aborting() -> None:
    wire = Wire(limits=Limits(idle_timeout=IDLE))
    wire.server.pause_writing()
    wire.server.resume_writing()
    wire.raw(f.frame(f.PING, 0, 1, bytes(8)))  # PING on a stream: a connection error
    assert goaway_code(wire.transport.take()) == f.PROTOCOL_ERROR
    assert (wire.transport.closed, wire.transport.aborted) == (False, False)
    wire.clock.advance(GOAWAY_GRACE)
    assert (wire.transport.closed, wire.transport.aborted) == (True, False)


def test_nothing_the_peer_sends_after_an_error_s_goaway_is_served() -> None:
    wire = Wire()
    wire.raw(f.frame(f.PING, 0, 1, bytes(8)))
    assert goaway_code(wire.transport.take()) == f.PROTOCOL_ERROR
    before = wire.transport.mark()
    wire.raw(headers_and_data())
    assert wire.transport.since(before) == b""
    assert wire.recorder.handlers == []


def headers_and_data() -> bytes:
    """A whole request on stream 1, as raw frames (the client library would not send after GOAWAY)."""
    block = header_block()
    return f.frame(f.HEADERS, f.END_HEADERS, 1, block) + f.frame(
        f.DATA, f.END_STREAM, 1, grpc_message(b"end")
    )


def _stalled(wire: Wire) -> None:
    wire.open()
    wire.pump()
    wire.server.pause_writing()
    wire.clock.advance(IDLE + 1)
    assert wire.transport.aborted


def _idle_closed(wire: Wire) -> None:
    wire.clock.advance(IDLE + 1)
    out = wire.transport.take()
    assert (goaway_code(out), goaway_debug(out)) == (f.NO_ERROR, "idle")
    wire.clock.advance(GOAWAY_GRACE + 1)
    assert wire.transport.closed


def _failed(wire: Wire) -> None:
    wire.raw(f.frame(f.PING, 0, 1, bytes(8)))  # its GOAWAY's linger timer is still armed
    assert goaway_code(wire.transport.take()) == f.PROTOCOL_ERROR


def _lost_mid_frame(wire: Wire) -> None:
    sid = wire.open()
    wire.pump()
    wire.raw(f.frame(f.DATA, 0, sid, grpc_message(b"half"))[:12])  # the header timer runs


@pytest.mark.parametrize(
    "ending",
    [
        pytest.param(_stalled, id="stalled"),
        pytest.param(_idle_closed, id="idle"),
        pytest.param(_failed, id="protocol-error"),
        pytest.param(_lost_mid_frame, id="lost-mid-frame"),
    ],
)
def test_losing_the_transport_after_any_ending_raises_nothing_and_leaves_no_timer(
    ending: Callable[[Wire], None],
) -> None:
    wire = Wire(limits=Limits(idle_timeout=IDLE, header_timeout=10.0))
    ending(wire)
    wire.lose()
    assert wire.clock.armed == 0
    assert wire.server.open_streams == 0


def test_draining_sends_one_goaway_however_often_it_is_asked_and_none_once_lost() -> None:
    """The server drains every connection on stop, and a second stop drains again."""
    wire = Wire()
    before = wire.transport.mark()
    wire.server.drain()
    wire.server.drain()
    assert goaway_code(wire.transport.since(before)) == f.NO_ERROR
    assert wire.transport.mark() == before + 1  # one write: one GOAWAY
    lost = Wire()
    lost.lose()
    lost.server.drain()  # the fake transport refuses a write after close
    assert lost.transport.take() == b""


def test_a_connection_error_is_logged_with_its_reason_and_code(caplog: pytest.LogCaptureFixture) -> None:
    wire = Wire()
    with caplog.at_level(logging.WARNING, logger="epp.h2.connection"):
        wire.raw(f.frame(f.PING, 0, 1, bytes(8)))
    out = wire.transport.take()
    (record,) = caplog.records
    assert record.getMessage() == f"closing an HTTP/2 connection: {goaway_debug(out)} (error code 1)"
