"""Cutting gRPC messages out of DATA frames that are not one whole message each (the reassembly path,
`Connection._messages`): several messages in a frame, empty ones, a frame that finishes its stream
halfway, a message split inside its 5-byte prefix. Every byte of such frames must come back to the
peer as connection credit exactly once, or a long-lived connection (Envoy keeps one per EPP) slowly
starves."""

from __future__ import annotations

import struct

import h2.settings
import pytest

from epp.h2 import frames as f
from epp.h2.connection import Limits

from .support import Wire, grpc_message, window_updates

FRAME = f.DEFAULT_MAX_FRAME


def connection_increments(out: bytes) -> list[int]:
    return [n for stream, n in window_updates(out) if stream == 0]


def two_messages(size: int, fill: bytes) -> bytes:
    """A DATA payload of exactly ``size`` bytes: a message of ``fill`` then an empty message."""
    return grpc_message(fill * (size - 10)) + grpc_message(b"")


def half_the_window(even: bool = False) -> tuple[Wire, int, int, int, list[int]]:
    """(wire, its connection window, an open stream, half the window, frame sizes of at most a frame
    that add up to exactly that half; an even number of them when ``even``)."""
    wire = Wire(limits=Limits(max_frame_bytes=FRAME))
    window = wire.client.outbound_flow_control_window
    sid = wire.open()
    wire.pump()
    half_spent = window - (window >> 1)
    count = -(-half_spent // FRAME)
    if even:
        count += count % 2
    sizes = [half_spent // count + (1 if i < half_spent % count else 0) for i in range(count)]
    return wire, window, sid, half_spent, sizes


def test_frames_of_several_messages_are_credited_whole_once_less_than_half_the_window_is_left() -> None:
    """Frames of two messages each (the second empty) spend exactly half the connection window: no
    credit yet (half is not less than half); one more frame brings all of it back in one update."""
    wire, window, sid, half_spent, sizes = half_the_window()
    for i, size in enumerate(sizes):
        frame = two_messages(size, bytes([65 + i % 26]))
        assert connection_increments(wire.answer_to(sid, frame)) == []
    assert wire.client.outbound_flow_control_window == window >> 1
    last = wire.answer_to(sid, two_messages(20, b"z"))
    assert connection_increments(last) == [half_spent + 20]
    assert wire.client.outbound_flow_control_window == window
    (handler,) = wire.recorder.handlers
    expected = [bytes([65 + i % 26]) * (size - 10) for i, size in enumerate(sizes)] + [b"z" * 10]
    assert handler.messages == [m for message in expected for m in (message, b"")]
    assert wire.results[sid].replies == [b"re:" + m for m in handler.messages]


def test_whole_message_frames_between_others_are_credited_on_the_same_schedule() -> None:
    """Frames of one whole message (the fast path, crediting inline) alternate with frames of two
    (the reassembly path): the credit both owe adds up, none at exactly half the window spent, and
    all of it in one update with the next frame."""
    # An even count: the frame that reaches exactly half is a whole-message one.
    wire, window, sid, half_spent, sizes = half_the_window(even=True)
    expected: list[bytes] = []
    for i, size in enumerate(sizes):
        fill = bytes([65 + i % 26])
        if i % 2:
            frame, expected = grpc_message(fill * (size - 5)), [*expected, fill * (size - 5)]
        else:
            frame, expected = two_messages(size, fill), [*expected, fill * (size - 10), b""]
        assert connection_increments(wire.answer_to(sid, frame)) == [], f"frame {i}"
    assert wire.client.outbound_flow_control_window == window >> 1
    last = wire.answer_to(sid, grpc_message(b"z" * 15))
    assert connection_increments(last) == [half_spent + 20]
    assert wire.client.outbound_flow_control_window == window
    inflow = wire.server._inflow  # and nothing more is owed: the next round starts from nothing
    assert (inflow.available, inflow.owed) == (window, 0)
    assert wire.recorder.handlers[0].messages == [*expected, b"z" * 15]


@pytest.mark.parametrize(
    ("finisher", "handled", "status", "message"),
    [
        pytest.param(
            grpc_message(b"zipped", compressed=True),
            [b"first"],
            12,
            "compressed messages are not supported",
            id="compressed",
        ),
        pytest.param(
            # declares 16 MiB + 5 bytes: the length's first byte counts too
            struct.pack(">BI", 0, (1 << 24) + 5) + b"abcde",
            [b"first"],
            8,
            f"grpc: received message larger than max ({(1 << 24) + 5} vs. 4194304)",
            id="larger-than-max",
        ),
        pytest.param(grpc_message(b"end"), [b"first", b"end"], 0, "", id="the-handler-ends-it"),
    ],
)
def test_a_frame_that_finishes_its_stream_halfway_gives_every_byte_back(
    finisher: bytes, handled: list[bytes], status: int, message: str
) -> None:
    """The messages handed over before the stream's status was decided and the bytes dropped after it
    are all credited to the connection: none lost, none twice."""
    wire = Wire()
    sid = wire.open()
    wire.client.send_data(sid, grpc_message(b"first") + finisher + grpc_message(b"after"))
    wire.pump()
    (handler,) = wire.recorder.handlers
    assert handler.messages == handled
    assert (wire.results[sid].status, wire.results[sid].message) == (status, message)
    inflow = wire.server._inflow
    assert inflow.held == 0  # every byte credited back or owed, none lost
    assert wire.client.outbound_flow_control_window == inflow.available  # the peer's count agrees


def test_a_message_split_inside_its_prefix_is_no_longer_counted_as_waiting_once_complete() -> None:
    """Three bytes of a prefix count as waiting (no length to reserve yet); once the message is
    complete nothing of it may still count, or such streams add up to a false RESOURCE_EXHAUSTED."""
    wire = Wire()
    sid = wire.open()
    whole = grpc_message(b"split")
    wire.client.send_data(sid, whole[:3])
    wire.pump()
    assert wire.server._unreserved == 3
    wire.client.send_data(sid, whole[3:] + grpc_message(b"next"))
    wire.pump()
    assert wire.recorder.handlers[0].messages == [b"split", b"next"]
    assert wire.server._unreserved == 0
    wire.client.send_data(sid, whole[:3])  # and the next split counts from nothing again
    wire.pump()
    assert wire.server._unreserved == 3


@pytest.mark.parametrize(
    ("frames", "handled", "status"),
    [
        pytest.param(
            # a 1-byte message then a 255-byte one: the first length and the next byte, read as five
            # length bytes, make 261, which is what follows the prefix
            [grpc_message(b"\x05") + grpc_message(b"y" * 255)],
            [b"\x05", b"y" * 255],
            None,
            id="two-messages-read-as-one",
        ),
        pytest.param(
            # declares 16 MiB + 3 bytes and carries 3: read without its first length byte, it is whole
            [struct.pack(">BI", 0, (1 << 24) + 3) + b"abc"],
            [],
            8,
            id="a-length-past-16-mib",
        ),
        pytest.param(
            # the rest of a message whose bytes happen to look like a whole message of their own
            [struct.pack(">BI", 0, 15) + b"head", b"\x00" + (6).to_bytes(4, "big") + b"tail!!"],
            [b"head\x00\x00\x00\x00\x06tail!!"],
            None,
            id="the-middle-of-a-message",
        ),
        pytest.param(
            # a message 10 bytes longer than its first frame carries: the prefix's 5 counted twice
            [struct.pack(">BI", 0, 30) + b"a" * 20, b"b" * 10],
            [b"a" * 20 + b"b" * 10],
            None,
            id="ten-bytes-still-to-come",
        ),
    ],
)
def test_a_frame_is_taken_as_one_whole_message_only_when_its_prefix_says_so(
    frames: list[bytes], handled: list[bytes], status: int | None
) -> None:
    """The fast path (a frame that is exactly one message, handed over at once) must agree with the
    reassembly path on every frame it takes: all four length bytes, on a stream holding no part of a
    message, and not a byte more."""
    wire = Wire()
    sid = wire.open()
    for frame in frames:
        wire.client.send_data(sid, frame)
        wire.pump()
    assert wire.recorder.handlers[0].messages == handled
    assert wire.results[sid].status == status
    inflow = wire.server._inflow
    assert inflow.held == 0  # every byte credited back or owed, none lost


def stream_increments(out: bytes, stream_id: int) -> list[int]:
    return [n for stream, n in window_updates(out) if stream == stream_id]


def test_a_stream_s_credit_comes_back_on_the_same_schedule() -> None:
    """Whole-message frames on one stream: none of its window comes back while half or more is
    left, then everything it spent in one update."""
    wire = Wire(limits=Limits(stream_window=65_535))
    sid = wire.open()
    wire.pump()
    assert wire.client.local_flow_control_window(sid) == 65_535
    for fill in (b"a", b"b"):  # 2 x 16,384: exactly half spent
        assert stream_increments(wire.answer_to(sid, grpc_message(fill * 16_379)), sid) == []
    assert stream_increments(wire.answer_to(sid, grpc_message(b"c" * 15)), sid) == [32_768 + 20]
    assert wire.client.local_flow_control_window(sid) == 65_535
    assert wire.recorder.handlers[0].messages == [b"a" * 16_379, b"b" * 16_379, b"c" * 15]


def test_a_stream_whose_status_is_decided_is_given_no_more_window() -> None:
    """The handler ended the stream while its reply waits for the peer's window (so the stream is
    still open); what the peer still sends on it is dropped and credited to the connection only: a
    stream window topped up would invite more bytes nobody reads."""
    initial_window = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE
    wire = Wire(limits=Limits(stream_window=65_535), client_settings={initial_window: 0}, ack_data=False)
    sid = wire.open()
    wire.send(sid, b"end")
    wire.pump()
    assert (wire.results[sid].status, wire.server.open_streams) == (None, 1)  # trailers held
    out = b"".join(wire.answer_to(sid, grpc_message(b"x" * 16_379)) for _ in range(3))
    assert stream_increments(out, sid) == []
    inflow = wire.server._inflow
    assert inflow.held == 0  # every byte credited back or owed, none lost
