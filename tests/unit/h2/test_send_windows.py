"""Replies against the peer's windows, at their edges: a reply exactly the size of its window goes
whole with its trailers, the last byte of a window is used, a stream held by the connection window
moves when that window grows (not only when its own does), and a stream reset while its reply waits
leaves nothing behind (a peer that resets such streams forever must not grow the server's memory)."""

from __future__ import annotations

import h2.settings
import pytest

from epp.h2 import frames as f

from .support import Script, Wire, grpc_message

INITIAL_WINDOW = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE
REPLY = grpc_message(b"re:end")  # what the server sends for b"end", prefix included (11 bytes)


def test_a_reply_exactly_the_size_of_its_stream_window_goes_whole_with_its_trailers() -> None:
    wire = Wire(client_settings={INITIAL_WINDOW: len(REPLY)}, ack_data=False)
    sid = wire.open()
    wire.send(sid, b"end")
    wire.pump()
    result = wire.results[sid]
    assert (result.data, result.status, result.ended) == (REPLY, 0, True)


def test_the_last_byte_of_a_stream_window_is_used() -> None:
    wire = Wire(client_settings={INITIAL_WINDOW: len(REPLY) - 1}, ack_data=False)
    sid = wire.open()
    wire.send(sid, b"end")
    wire.pump()
    assert (wire.results[sid].data, wire.results[sid].status) == (REPLY[:-1], None)
    wire.client.increment_flow_control_window(1, stream_id=sid)
    wire.pump()
    assert (wire.results[sid].data, wire.results[sid].status) == (REPLY, 0)


def exhaust_the_connection_window(wire: Wire) -> None:
    """A first stream's reply takes all of the connection window the peer never gives back."""
    sid = wire.open()
    wire.client.increment_flow_control_window(f.DEFAULT_WINDOW, stream_id=sid)
    wire.send(sid, b"w" * (f.DEFAULT_WINDOW - 8))  # its reply: "re:" + that + 5 = the whole window
    wire.pump()
    assert len(wire.results[sid].data) == f.DEFAULT_WINDOW


def test_a_stream_held_by_the_connection_window_moves_when_that_window_grows() -> None:
    """One byte of stream window left and none of the connection's: the stream waits for the
    connection, and is sent its byte as soon as the connection window grows."""
    wire = Wire(client_settings={INITIAL_WINDOW: 0}, ack_data=False)
    exhaust_the_connection_window(wire)
    sid = wire.open()
    wire.client.increment_flow_control_window(1, stream_id=sid)
    wire.send(sid, b"x")
    wire.pump()
    assert wire.results[sid].data == b""
    wire.client.increment_flow_control_window(1)  # one byte is enough to move
    wire.pump()
    assert wire.results[sid].data == grpc_message(b"re:x")[:1]


@pytest.mark.parametrize("held_by", ["connection-window", "stream-window"])
def test_streams_reset_while_their_replies_wait_for_window_leave_nothing_behind(held_by: str) -> None:
    wire = Wire(Script(), client_settings={INITIAL_WINDOW: 0}, ack_data=False)
    if held_by == "connection-window":
        exhaust_the_connection_window(wire)
    sids = [wire.open() for _ in range(3)]
    for sid in sids:
        if held_by == "connection-window":
            wire.client.increment_flow_control_window(100, stream_id=sid)
        wire.send(sid, b"x")
    wire.pump()
    assert all(wire.results[sid].data == b"" for sid in sids)  # every reply waits
    assert len(wire.server._conn_blocked) + len(wire.server._window_blocked) == 3
    for sid in sids:
        wire.client.reset_stream(sid)
    wire.pump()
    left = 1 if held_by == "connection-window" else 0  # the stream that took the window
    blocked = (wire.server._conn_blocked, wire.server._window_blocked)
    assert (blocked, wire.server.open_streams) == (({}, set()), left)
