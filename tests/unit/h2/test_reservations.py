"""Reservations for messages larger than their stream window, at their edges: the prefix alone is
enough to reserve, the window is widened by exactly what is missing (never by 0, never a byte short),
the budget is filled exactly before anyone waits, and what was lent comes back exactly.

`test_limits.py` holds the ordinary cases; these are the boundaries a peer (Envoy, with its 4 MiB
messages against a 1 MiB stream window) crosses every day, where an off-by-one either stalls a
stream for good or lets the peer past its window."""

from __future__ import annotations

import struct

import pytest

from epp.h2 import frames as f
from epp.h2.connection import Limits

from .support import Wire, grpc_message, window_updates

WINDOW = 65_535


def limits(max_message_bytes: int) -> Limits:
    """Small windows; a reservation budget of exactly one largest message (its length + 5)."""
    return Limits(
        max_message_bytes=max_message_bytes,
        max_frame_bytes=f.DEFAULT_MAX_FRAME,
        stream_window=WINDOW,
        connection_window=WINDOW,
    )


def widened(wire: Wire, sid: int, data: bytes) -> list[int]:
    """The stream's WINDOW_UPDATE increments the server wrote while ``data`` was received."""
    return [n for stream, n in window_updates(wire.answer_to(sid, data)) if stream == sid]


@pytest.mark.parametrize(
    ("length", "max_message_bytes"),
    [
        pytest.param(100_000, 100_000, id="larger-than-the-window"),
        pytest.param(WINDOW - 5, 100_000, id="exactly-the-window"),
        pytest.param(WINDOW - 4, 100_000, id="one-byte-past-the-window"),
        pytest.param((1 << 24) + 10, (1 << 24) + 10, id="past-16-MiB"),
    ],
)
def test_the_prefix_alone_reserves_its_message_and_widens_the_window_by_what_is_missing(
    length: int, max_message_bytes: int
) -> None:
    """The 5 bytes of a message's prefix give its length: the stream window is widened at once by
    exactly what the whole message needs beyond it (none at all when it fits to the byte)."""
    wire = Wire(limits=limits(max_message_bytes))
    sid = wire.open()
    missing = 5 + length - WINDOW
    assert widened(wire, sid, struct.pack(">BI", 0, length)) == ([missing] if missing > 0 else [])
    assert wire.client.local_flow_control_window(sid) == max(WINDOW, 5 + length) - 5


def test_the_budget_is_filled_to_the_byte_before_anyone_waits_and_an_exact_fit_follows() -> None:
    """A budget of 200,005 bytes: messages of 100,005 and 100,000 bytes (prefixes included) are both
    reserved; a third of 100,005 waits until the first is complete, then fits exactly."""
    wire = Wire(limits=limits(200_000))
    assert limits(200_000).reservation_budget == 200_005
    first, second, third = wire.open(), wire.open(), wire.open()
    first_message = grpc_message(b"a" * 100_000)
    assert widened(wire, first, first_message[:5]) == [100_005 - WINDOW]
    assert widened(wire, second, struct.pack(">BI", 0, 99_995)) == [100_000 - WINDOW]
    assert widened(wire, third, struct.pack(">BI", 0, 100_000)) == []  # the budget is full: it waits
    before = wire.transport.mark()
    wire.send_bytes(first, first_message[5:])
    wire.pump()
    updates = dict(window_updates(wire.transport.since(before)))
    assert updates.get(third) == 100_005 - WINDOW  # reserved as soon as the first one was handed over
    assert wire.results[first].replies == [b"re:" + b"a" * 100_000]


def held_window(wire: Wire, sid: int) -> int:
    """The stream's window on the server's count: what the peer may still send, what is owed to it
    and what the stream holds, less what was lent past the window (always the window itself)."""
    stream = wire.server._streams[sid]
    return stream.recv.available + stream.recv.owed + stream.held - stream.lent


def test_what_was_lent_to_large_messages_comes_back_exactly() -> None:
    """Each 100,000-byte message borrows past the stream window and repays it once complete: frame
    after frame the stream's window stays itself, on the server's count and on the peer's."""
    wire = Wire(limits=limits(100_000))
    sid = wire.open()
    message = grpc_message(b"l" * 100_000)
    for round_ in range(3):
        for start in range(0, len(message), f.DEFAULT_MAX_FRAME):
            wire.client.send_data(sid, message[start : start + f.DEFAULT_MAX_FRAME])
            wire.pump()
            assert held_window(wire, sid) == WINDOW
            assert wire.client.local_flow_control_window(sid) == wire.server._streams[sid].recv.available
        assert wire.results[sid].replies == [b"re:" + b"l" * 100_000] * (round_ + 1)
        assert wire.server._streams[sid].lent == 0


def test_a_waiting_message_past_16_mib_is_reserved_for_its_whole_length_when_its_turn_comes() -> None:
    wire = Wire(limits=limits((1 << 24) + 10))
    first, second = wire.open(), wire.open()
    first_message = grpc_message(b"f" * 100_000)
    assert widened(wire, first, first_message[:5]) == [100_005 - WINDOW]
    assert widened(wire, second, struct.pack(">BI", 0, (1 << 24) + 10)) == []  # over the budget: waits
    wire.send_bytes(first, first_message[5:])
    assert widened(wire, second, b"") == [(1 << 24) + 15 - WINDOW]


def test_a_message_that_completes_while_waiting_leaves_the_line_and_holds_nothing() -> None:
    """A message that fits its stream window needs no reservation: one that completes while it waits
    for one leaves the line, as does a small one completing beside it, and nothing stays held."""
    wire = Wire(limits=limits(100_000))
    reserved, waiting, small = wire.open(), wire.open(), wire.open()
    big, fits, tiny = grpc_message(b"r" * 100_000), grpc_message(b"w" * 50_000), grpc_message(b"tiny")
    wire.client.send_data(reserved, big[:10_000])
    wire.client.send_data(waiting, fits[:10_000])
    wire.pump()
    assert list(wire.server._waiting) == [wire.server._streams[waiting]]
    wire.client.send_data(small, tiny[:4])
    wire.client.send_data(small, tiny[4:])
    wire.send_bytes(waiting, fits[10_000:])
    wire.pump()
    assert wire.server._waiting == {}
    wire.send_bytes(reserved, big[10_000:])
    wire.pump()
    assert (wire.server._reserved, wire.server._unreserved) == (0, 0)
    assert [wire.results[sid].replies for sid in (reserved, waiting, small)] == [
        [b"re:" + b"r" * 100_000],
        [b"re:" + b"w" * 50_000],
        [b"re:tiny"],
    ]


def test_a_prefix_split_before_its_length_is_uncounted_once_the_message_is_reserved() -> None:
    """Three bytes of a prefix count as waiting; once the length is known the message is reserved and
    nothing of it counts as waiting any more, nor after it is complete."""
    wire = Wire(limits=limits(100_000))
    sid = wire.open()
    message = grpc_message(b"s" * 100_000)
    wire.client.send_data(sid, message[:3])
    wire.pump()
    assert wire.server._unreserved == 3
    wire.client.send_data(sid, message[3:1_000])
    wire.pump()
    assert (wire.server._unreserved, wire.server._reserved) == (0, 100_005)
    wire.send_bytes(sid, message[1_000:])
    wire.pump()
    assert (wire.server._unreserved, wire.server._reserved) == (0, 0)
    assert wire.results[sid].replies == [b"re:" + b"s" * 100_000]
