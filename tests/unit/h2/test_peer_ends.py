"""The peer's END_STREAM or RST_STREAM at each stage of a stream: while its handler is suspended,
while its trailers wait for window, halfway through a large message (trailers crossing the server's
end: `test_connection.py::test_trailers_in_flight_for_a_stream_the_server_closed_are_ignored`).
Each must leave the stream served to its end, or gone without a trace (nothing reserved, nothing
counted), never half of each."""

from __future__ import annotations

import asyncio
import struct

import h2.settings
import pytest

from epp.h2 import frames as f
from epp.h2.connection import Limits

from .support import Wire, grpc_message, suspended_stream, window_updates

INITIAL_WINDOW = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE


def test_a_stream_the_peer_ends_while_its_handle_is_suspended_stays_open_until_it_answers() -> None:
    asyncio.run(_ended_while_suspended())


async def _ended_while_suspended() -> None:
    """Still open (a graceful stop waits for a connection's `idle`) until its answer reaches the peer."""
    wire, sid, gate = suspended_stream()
    wire.client.end_stream(sid)
    wire.pump()
    assert (wire.server.open_streams, wire.server.idle.is_set()) == (1, False)
    gate.set_result(None)
    await wire.settle()
    assert (wire.results[sid].replies, wire.results[sid].status) == ([b"re:wait"], 0)
    assert (wire.server.open_streams, wire.server.idle.is_set()) == (0, True)


def test_a_stream_the_peer_ends_while_its_trailers_wait_for_window_still_gets_them() -> None:
    wire = Wire(client_settings={INITIAL_WINDOW: 5}, ack_data=False)
    sid = wire.open()
    wire.send(sid, b"end")  # the handler ends the stream; 5 of its 11 bytes fit the window
    wire.pump()
    assert (len(wire.results[sid].data), wire.results[sid].status) == (5, None)
    wire.client.end_stream(sid)
    wire.pump()
    wire.client.increment_flow_control_window(100, stream_id=sid)
    wire.pump()
    result = wire.results[sid]
    assert (result.data, result.status, result.ended) == (grpc_message(b"re:end"), 0, True)
    assert wire.server.open_streams == 0


LARGE = Limits(
    max_message_bytes=100_000,
    max_frame_bytes=f.DEFAULT_MAX_FRAME,
    stream_window=65_535,
    connection_window=65_535,
)


@pytest.mark.parametrize(
    "received",
    [
        pytest.param(struct.pack(">BI", 0, 100_000)[:3], id="counted-a-partial-prefix"),
        pytest.param(struct.pack(">BI", 0, 100_000) + b"r" * 1_000, id="reserved-a-large-message"),
    ],
)
def test_a_stream_reset_halfway_through_a_message_leaves_nothing_reserved_or_counted(received: bytes) -> None:
    """Else each such reset shrinks the reservation budget for good, until every large message waits."""
    wire = Wire(limits=LARGE)
    sid = wire.open()
    wire.client.send_data(sid, received)
    wire.pump()
    assert wire.server._reserved + wire.server._unreserved > 0
    wire.client.reset_stream(sid)
    wire.pump()
    assert (wire.server._reserved, wire.server._unreserved, wire.server._waiting) == (0, 0, {})
    other = wire.open()
    before = wire.transport.mark()
    wire.client.send_data(other, struct.pack(">BI", 0, 100_000))
    wire.pump()
    assert other in dict(window_updates(wire.transport.since(before)))  # reserved at once
