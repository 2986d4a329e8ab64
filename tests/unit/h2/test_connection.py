"""`epp.h2.Connection` against an independent HTTP/2 client: streams, gRPC framing, flow control,
errors, and what a broken peer gets."""

from __future__ import annotations

import asyncio
import logging

import h2.events
import h2.settings
import pytest
from hpack import Encoder

from epp.h2 import frames as f
from epp.h2.connection import Connection, Limits, StreamError

from .support import (
    PATH,
    FakeTransport,
    Script,
    Wire,
    frames_in,
    goaway_code,
    goaway_debug,
    grpc_message,
    header_block,
    resets_in,
    suspended_stream,
    window_updates,
)


def test_a_stream_gets_each_reply_in_order_then_ok_trailers() -> None:
    wire = Wire()
    sid = wire.open()
    wire.send(sid, b"one", b"two", b"silent", b"three", end=True)
    wire.pump()
    result = wire.results[sid]
    assert dict(result.headers) == {b":status": b"200", b"content-type": b"application/grpc"}
    assert result.replies == [b"re:one", b"re:two", b"re:three"]
    assert (result.status, result.ended, result.reset) == (0, True, None)
    assert result.trailers == [(b"grpc-status", b"0")]  # no grpc-message on OK
    [handler] = wire.recorder.handlers
    assert handler.messages == [b"one", b"two", b"silent", b"three"]
    assert handler.closed == 1


def test_a_handler_that_ends_its_stream_sends_its_reply_then_bare_ok_trailers() -> None:
    wire = Wire()
    sid = wire.open()
    wire.send(sid, b"first", b"end")
    wire.pump()
    result = wire.results[sid]
    assert result.replies == [b"re:first", b"re:end"]
    assert result.trailers == [(b"grpc-status", b"0")]
    assert (result.ended, result.reset) == (True, f.NO_ERROR)  # the peer had not ended its side


def test_a_stream_error_without_a_message_keeps_its_status() -> None:
    wire = Wire(Script(fail_on={b"missing": lambda: StreamError(5, "")}))
    sid = wire.open()
    wire.send(sid, b"missing")
    wire.pump()
    result = wire.results[sid]
    assert (result.trailers, result.status) == ([], 5)  # a trailers-only response: no reply was sent
    assert b"grpc-message" not in dict(result.headers)


def test_streams_interleave_on_one_connection() -> None:
    wire = Wire()
    first, second = wire.open(), wire.open()
    wire.send(second, b"b1")
    wire.send(first, b"a1")
    wire.send(second, b"b2", end=True)
    wire.send(first, b"a2", end=True)
    wire.pump()
    assert wire.results[first].replies == [b"re:a1", b"re:a2"]
    assert wire.results[second].replies == [b"re:b1", b"re:b2"]
    assert [h.closed for h in wire.recorder.handlers] == [1, 1]


def test_a_message_split_over_padded_frames_is_reassembled_and_windows_are_topped_up() -> None:
    """3 MiB through 64 KiB stream and connection windows: only the server's WINDOW_UPDATEs let it pass."""
    limits = Limits(max_message_bytes=4 * 1024 * 1024, stream_window=65_535, connection_window=65_535)
    wire = Wire(limits=limits)
    sid = wire.open()
    big = bytes(range(256)) * (3 * 1024 * 4)
    data = grpc_message(big)
    sent = 0
    while sent < len(data):
        # A padded frame costs its data, the pad length byte and 10 bytes of padding.
        room = min(wire.client.local_flow_control_window(sid), wire.client.max_outbound_frame_size) - 11
        assert room > 0, "the server never topped the window up"
        chunk = data[sent : sent + room]
        wire.client.send_data(sid, chunk, pad_length=10)
        sent += len(chunk)
        wire.pump()
    wire.client.end_stream(sid)
    wire.pump()
    assert wire.recorder.handlers[0].messages == [big]
    assert wire.results[sid].replies == [b"re:" + big]
    assert wire.results[sid].status == 0
    inflow = wire.server._inflow  # every byte, padding too, credited back once
    assert inflow.held == 0  # every byte credited back or owed, none lost
    assert wire.client.outbound_flow_control_window == inflow.available


def test_an_unknown_method_is_unimplemented_and_no_handler_is_made() -> None:
    wire = Wire()
    sid = wire.open("/other.Service/Method", end_stream=True)
    wire.pump()
    result = wire.results[sid]
    assert result.status == 12
    assert "/other.Service/Method" in result.message
    assert result.ended
    assert wire.recorder.handlers == []


@pytest.mark.parametrize("end_stream", [True, False], ids=["peer-ended", "peer-open"])
def test_an_unknown_method_s_stream_is_closed_as_the_peer_left_it(end_stream: bool) -> None:
    """UNIMPLEMENTED ends the server's side. A peer still open is told to stop sending (RST_STREAM
    NO_ERROR) and what it had in flight is ignored; a peer that had ended the stream is not reset,
    and DATA from it afterwards is a connection error (STREAM_CLOSED)."""
    wire = Wire()
    wire.transport.take()
    flags = f.END_HEADERS | (f.END_STREAM if end_stream else 0)
    wire.raw(f.frame(f.HEADERS, flags, 1, header_block("/other.Service/Method")))
    assert resets_in(wire.transport.take()) == ({} if end_stream else {1: f.NO_ERROR})
    wire.raw(f.frame(f.DATA, 0, 1, b"x"))
    out = wire.transport.take()
    expected = (f.STREAM_CLOSED, "DATA on closed stream 1") if end_stream else (None, None)
    assert (goaway_code(out), goaway_debug(out)) == expected


def test_a_request_whose_headers_carry_priority_fields_is_served() -> None:
    """RFC 9113 §6.2: the PRIORITY flag adds 5 bytes before the header block; they are skipped."""
    wire = Wire()
    priority = b"\x00\x00\x00\x00\x10"  # depends on stream 0, weight 17
    wire.raw(f.frame(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, priority + header_block()))
    wire.raw(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"ask")))
    assert wire.recorder.handlers[0].messages == [b"ask"]
    assert resets_in(wire.transport.take()) == {}


def test_a_message_over_the_limit_ends_only_its_stream_with_resource_exhausted() -> None:
    wire = Wire(limits=Limits(max_message_bytes=100))
    big, small = wire.open(), wire.open()
    wire.send(big, b"x" * 101)
    wire.send(small, b"fits", end=True)
    wire.pump()
    assert wire.results[big].status == 8
    assert "larger than max (101 vs. 100)" in wire.results[big].message
    assert wire.results[big].reset == f.NO_ERROR  # told to stop sending the rest
    assert wire.results[small].replies == [b"re:fits"]
    assert wire.recorder.handlers[0].messages == []
    assert [h.closed for h in wire.recorder.handlers] == [1, 1]


def test_a_compressed_message_is_unimplemented() -> None:
    wire = Wire()
    sid = wire.open()
    wire.client.send_data(sid, grpc_message(b"zipped", compressed=True), end_stream=True)
    wire.pump()
    assert wire.results[sid].status == 12
    assert "compressed" in wire.results[sid].message


def test_a_stream_that_ends_inside_a_message_is_invalid_argument() -> None:
    wire = Wire()
    sid = wire.open()
    wire.client.send_data(sid, grpc_message(b"whole")[:-2], end_stream=True)
    wire.pump()
    assert (wire.results[sid].status, wire.results[sid].message) == (3, "the stream ended inside a message")


def test_a_stream_error_reaches_the_client_as_status_and_percent_encoded_message() -> None:
    script = Script(fail_on={b"bad": lambda: StreamError(3, "100% wrong:\nnaïve")})
    wire = Wire(script)
    sid = wire.open()
    wire.send(sid, b"fine", b"bad", b"never handled")
    wire.pump()
    result = wire.results[sid]
    assert result.replies == [b"re:fine"]
    assert result.status == 3
    assert dict(result.trailers)[b"grpc-message"] == b"100%25 wrong:%0Ana%C3%AFve"
    assert wire.recorder.handlers[0].messages == [b"fine", b"bad"]
    assert wire.recorder.handlers[0].closed == 1


def test_an_unexpected_handler_error_is_unknown_and_logged_and_the_connection_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wire = Wire(Script(fail_on={b"boom": lambda: RuntimeError("kaput")}))
    first = wire.open()
    with caplog.at_level(logging.ERROR, logger="epp.h2.connection"):
        wire.send(first, b"boom")
        wire.pump()
    assert wire.results[first].status == 2
    assert "RuntimeError: kaput" in wire.results[first].message
    assert "kaput" in caplog.text
    second = wire.open()
    wire.send(second, b"again", end=True)
    wire.pump()
    assert wire.results[second].replies == [b"re:again"]


def test_end_before_the_client_finishes_sends_trailers_then_stops_the_client() -> None:
    wire = Wire()
    sid = wire.open()
    wire.send(sid, b"end")
    wire.pump()
    result = wire.results[sid]
    assert result.replies == [b"re:end"]
    assert result.status == 0
    assert result.reset == f.NO_ERROR
    assert wire.recorder.handlers[0].closed == 1


def test_replies_wait_for_the_peers_window_and_trailers_wait_for_the_data() -> None:
    wire = Wire(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10}, ack_data=False)
    sid = wire.open()
    wire.send(sid, b"a" * 40, end=True)
    wire.pump()
    result = wire.results[sid]
    assert len(result.data) == 10  # the first 10 bytes of the 48-byte message, nothing more
    assert not result.ended
    while not result.ended:
        before = len(result.data)
        wire.client.increment_flow_control_window(7, stream_id=sid)
        wire.pump()
        assert len(result.data) - before <= 7
    assert result.replies == [b"re:" + b"a" * 40]
    assert result.status == 0


def test_reply_data_respects_the_peers_frame_size() -> None:
    wire = Wire(limits=Limits(max_message_bytes=1 << 20))
    sid = wire.open()
    wire.send(sid, b"z" * 50_000, end=True)
    wire.pump()  # the h2 client rejects any DATA frame over its 16 KiB default with a GOAWAY
    assert wire.goaway is None
    assert wire.results[sid].replies == [b"re:" + b"z" * 50_000]


def test_ping_is_answered() -> None:
    wire = Wire()
    wire.client.ping(b"12345678")
    events = wire.pump()
    assert [e.ping_data for e in events if isinstance(e, h2.events.PingAckReceived)] == [b"12345678"]


def test_client_trailers_end_the_stream() -> None:
    wire = Wire()
    sid = wire.open()
    wire.send(sid, b"one")
    wire.client.send_headers(sid, [("grpc-trailer", "x")], end_stream=True)
    wire.pump()
    assert wire.results[sid].replies == [b"re:one"]
    assert wire.results[sid].status == 0


def test_headers_split_into_continuation_frames_are_joined() -> None:
    wire = Wire()
    block = header_block()
    wire.raw(f.frame(f.HEADERS, 0, 1, block[:5]) + f.frame(f.CONTINUATION, 0, 1, block[5:9]))
    wire.raw(f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[9:]))
    wire.raw(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"joined")))
    assert wire.recorder.handlers[0].messages == [b"joined"]
    assert wire.recorder.handlers[0].closed == 1


def test_a_suspended_handle_keeps_later_messages_waiting_in_order() -> None:
    asyncio.run(_test_a_suspended_handle_keeps_later_messages_waiting_in_order())


async def _test_a_suspended_handle_keeps_later_messages_waiting_in_order() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate))
    sid = wire.open()
    wire.send(sid, b"wait-1", b"two", b"three", end=True)
    wire.pump()
    handler = wire.recorder.handlers[0]
    assert handler.messages == [b"wait-1"]
    assert wire.results[sid].data == b""
    gate.set_result(None)
    await wire.settle()
    assert handler.messages == [b"wait-1", b"two", b"three"]
    assert wire.results[sid].replies == [b"re:wait-1", b"re:two", b"re:three"]
    assert wire.results[sid].status == 0
    assert handler.closed == 1


def test_streams_suspended_on_the_same_future_in_one_pass_all_resume() -> None:
    asyncio.run(_test_streams_suspended_on_the_same_future_in_one_pass_all_resume())


async def _test_streams_suspended_on_the_same_future_in_one_pass_all_resume() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate))
    streams = [wire.open() for _ in range(3)]
    for sid in streams:
        wire.send(sid, b"wait", end=True)
    wire.pump()  # one pass: the three handlers await the same future before any task runs
    gate.set_result(None)
    await wire.settle()
    assert [(wire.results[sid].replies, wire.results[sid].status) for sid in streams] == [
        ([b"re:wait"], 0)
    ] * 3


def test_a_client_reset_cancels_a_suspended_handle_and_closes_its_handler_once() -> None:
    asyncio.run(_test_a_client_reset_cancels_a_suspended_handle_and_closes_its_handler_once())


async def _test_a_client_reset_cancels_a_suspended_handle_and_closes_its_handler_once() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate))
    sid = wire.open()
    wire.send(sid, b"wait")
    wire.pump()
    handler = wire.recorder.handlers[0]
    assert handler.closed == 0
    wire.client.reset_stream(sid, f.CANCEL)
    wire.pump()
    await wire.settle()
    assert handler.cancelled
    assert handler.closed == 1
    assert wire.server.open_streams == 0
    assert not gate.done()  # the test's future is untouched; only the handler was cancelled
    gate.cancel()


def test_a_handle_cancelled_in_its_task_is_not_reported_as_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asyncio.run(_test_a_handle_cancelled_in_its_task_is_not_reported_as_a_failure(caplog))


async def _test_a_handle_cancelled_in_its_task_is_not_reported_as_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate))
    sid = wire.open()
    wire.send(sid, b"wait")
    wire.pump()
    await wire.settle()  # the task has taken the handle over
    with caplog.at_level(logging.ERROR, logger="epp.h2.connection"):
        wire.client.reset_stream(sid, f.CANCEL)
        wire.pump()
        await wire.settle()
    assert wire.recorder.handlers[0].cancelled
    assert wire.recorder.handlers[0].closed == 1
    assert caplog.records == []
    gate.cancel()


def test_a_client_reset_of_an_idle_stream_closes_its_handler() -> None:
    wire = Wire()
    sid = wire.open()
    wire.send(sid, b"one")
    wire.pump()
    wire.client.reset_stream(sid, f.CANCEL)
    wire.pump()
    assert wire.recorder.handlers[0].closed == 1
    assert wire.server.idle.is_set()


def test_losing_the_connection_closes_every_open_handler() -> None:
    asyncio.run(_test_losing_the_connection_closes_every_open_handler())


async def _test_losing_the_connection_closes_every_open_handler() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate))
    idle, suspended = wire.open(), wire.open()
    wire.send(idle, b"one")
    wire.send(suspended, b"wait")
    wire.pump()
    wire.lose()
    await wire.server.wait_closed()
    assert [h.closed for h in wire.recorder.handlers] == [1, 1]
    assert wire.recorder.handlers[1].cancelled
    gate.cancel()


def test_a_draining_connection_refuses_new_streams_and_finishes_open_ones() -> None:
    wire = Wire()
    before = wire.open()
    wire.send(before, b"one")
    wire.pump()
    wire.server.drain()
    wire.pump()
    assert wire.goaway is not None
    assert (wire.goaway.error_code, wire.goaway.last_stream_id) == (f.NO_ERROR, before)
    # The h2 client stops at a GOAWAY; the rest of the stream is written by hand.
    wire.raw(f.frame(f.DATA, f.END_STREAM, before, grpc_message(b"two")))
    out = frames_in(wire.transport.take())
    assert [(kind, flags & f.END_STREAM) for kind, flags, sid, _ in out if sid == before] == [
        (f.DATA, 0),
        (f.HEADERS, f.END_STREAM),
    ]
    assert wire.recorder.handlers[0].messages == [b"one", b"two"]
    assert wire.server.idle.is_set()
    # A stream the client opens anyway (it had not seen the GOAWAY) is refused.
    wire.raw(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, before + 2, header_block()))
    assert f.rst_stream(before + 2, f.REFUSED_STREAM) in wire.transport.take()
    assert len(wire.recorder.handlers) == 1


PROTOCOL_VIOLATIONS = [
    pytest.param(f.frame(f.DATA, 0, 0, b"x"), f.PROTOCOL_ERROR, "DATA on stream 0", id="data-on-stream-0"),
    pytest.param(
        f.frame(f.DATA, 0, 7, b"x"), f.PROTOCOL_ERROR, "DATA on idle stream 7", id="data-on-an-idle-stream"
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS, 2, header_block()),
        f.PROTOCOL_ERROR,
        "HEADERS on stream 2",
        id="even-stream",
    ),
    pytest.param(
        f.frame(f.CONTINUATION, f.END_HEADERS, 1, b""),
        f.PROTOCOL_ERROR,
        "CONTINUATION without its HEADERS",
        id="lone-continuation",
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS, 1, header_block()) + f.frame(f.CONTINUATION, f.END_HEADERS, 1, b""),
        f.PROTOCOL_ERROR,
        "CONTINUATION without its HEADERS",
        id="continuation-after-its-block-ended",
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, header_block()) + f.frame(f.DATA, 0, 1, b"x"),
        f.STREAM_CLOSED,
        "DATA on closed stream 1",
        id="data-after-the-peer-ended-the-stream",
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, header_block())
        + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, header_block()),
        f.STREAM_CLOSED,
        "HEADERS on closed stream 1",
        id="headers-after-the-peer-ended-the-stream",
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS, 5, header_block())
        + f.frame(f.HEADERS, f.END_HEADERS, 3, header_block()),
        f.PROTOCOL_ERROR,
        "stream 3 opened after 5",
        id="stream-opened-out-of-order",
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, b"\x00\x00\x00\x00"),
        f.PROTOCOL_ERROR,
        "HEADERS too short for its priority",
        id="headers-too-short-for-its-priority",
    ),
    pytest.param(
        f.frame(f.PING, 0, 1, b"12345678"), f.PROTOCOL_ERROR, "PING on a stream", id="ping-on-a-stream"
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, b"\x00\x00\x00\x01\x10" + header_block()),
        f.PROTOCOL_ERROR,
        "stream 1 depends on itself",
        id="headers-depending-on-their-own-stream",
    ),
    pytest.param(
        f.frame(f.HEADERS, 0, 1, header_block()) + f.frame(f.PING, 0, 0, b"12345678"),
        f.PROTOCOL_ERROR,
        "a header block was interrupted",
        id="frame-inside-a-header-block",
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff"),
        f.COMPRESSION_ERROR,
        "undecodable header block (HPACKDecodingError)",
        id="bad-hpack",
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS | f.PADDED, 1, b""),
        f.PROTOCOL_ERROR,
        "padded frame without a pad length",
        id="no-pad-length",
    ),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS | f.PADDED, 1, b"\x04abc"),
        f.PROTOCOL_ERROR,
        "padding longer than the frame",
        id="padding-as-long-as-the-frame",
    ),
    pytest.param(
        f.frame(f.SETTINGS, 0, 0, b"\x00\x04\x00"),
        f.FRAME_SIZE_ERROR,
        "SETTINGS payload not a multiple of 6",
        id="settings-length",
    ),
    pytest.param(
        f.settings_frame({f.SETTINGS_MAX_FRAME_SIZE: 100}),
        f.PROTOCOL_ERROR,
        "max frame size 100 out of range",
        id="settings-frame-size",
    ),
    pytest.param(
        f.frame(f.SETTINGS, 0, 1, b""), f.PROTOCOL_ERROR, "SETTINGS on a stream", id="settings-on-a-stream"
    ),
    pytest.param(
        f.frame(f.SETTINGS, f.ACK, 0, b"\x00" * 6),
        f.FRAME_SIZE_ERROR,
        "SETTINGS ACK with a payload",
        id="settings-ack-with-a-payload",
    ),
    pytest.param(
        f.window_update(0, f.MAX_WINDOW),
        f.FLOW_CONTROL_ERROR,
        "connection window over 2^31-1",
        id="window-overflow",
    ),
    pytest.param(f.window_update(0, 0), f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0", id="window-update-of-zero"),
    pytest.param(
        f.frame(f.WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"),
        f.FRAME_SIZE_ERROR,
        "WINDOW_UPDATE of the wrong size",
        id="window-update-length",
    ),
    pytest.param(
        f.window_update(9, 1),
        f.PROTOCOL_ERROR,
        "WINDOW_UPDATE on idle stream 9",
        id="window-update-idle-stream",
    ),
    pytest.param(
        f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\x00\x00\x00\x02"),
        f.PROTOCOL_ERROR,
        "a client cannot push",
        id="push",
    ),
    pytest.param(
        f.frame(f.PING, 0, 0, b"short"), f.FRAME_SIZE_ERROR, "PING of the wrong size", id="ping-length"
    ),
    pytest.param(
        b"\x10\x00\x01" + b"\x00\x00\x00\x00\x00\x01",
        f.FRAME_SIZE_ERROR,
        "frame of 1048577 bytes over 16384",
        id="frame-over-the-limit",
    ),
    pytest.param(
        f.frame(f.PRIORITY, 0, 0, b"\x00\x00\x00\x01\x10"),
        f.PROTOCOL_ERROR,
        "PRIORITY on stream 0",
        id="priority-on-stream-0",
    ),
    pytest.param(
        f.frame(f.PRIORITY, 0, 1, b"\x00"),
        f.FRAME_SIZE_ERROR,
        "PRIORITY of the wrong size",
        id="priority-length",
    ),
    pytest.param(
        f.frame(f.PRIORITY, 0, 1, b"\x00\x00\x00\x01\x10"),
        f.PROTOCOL_ERROR,
        "stream 1 depends on itself",
        id="priority-on-itself",
    ),
    pytest.param(
        f.rst_stream(0, f.CANCEL), f.PROTOCOL_ERROR, "RST_STREAM on stream 0", id="reset-of-stream-0"
    ),
    pytest.param(
        f.frame(f.RST_STREAM, 0, 1, b"\x00"),
        f.FRAME_SIZE_ERROR,
        "RST_STREAM of the wrong size",
        id="reset-length",
    ),
    pytest.param(
        f.rst_stream(9, f.CANCEL),
        f.PROTOCOL_ERROR,
        "RST_STREAM on idle stream 9",
        id="reset-of-an-idle-stream",
    ),
    pytest.param(
        f.frame(f.GOAWAY, 0, 1, b"\x00" * 8), f.PROTOCOL_ERROR, "GOAWAY on a stream", id="goaway-on-a-stream"
    ),
    pytest.param(
        f.frame(f.HEADERS, 0, 1, b"\x00" * f.DEFAULT_MAX_FRAME)
        + f.frame(f.CONTINUATION, 0, 1, b"\x00" * f.DEFAULT_MAX_FRAME) * 8,
        f.PROTOCOL_ERROR,
        "header block too large",
        id="header-block-over-twice-the-header-list-limit",
    ),
]


@pytest.mark.parametrize(("data", "code", "why"), PROTOCOL_VIOLATIONS)
def test_a_protocol_violation_ends_the_connection_with_goaway(data: bytes, code: int, why: str) -> None:
    """The GOAWAY's code, and its debug data telling the peer in words what was wrong."""
    wire = Wire(limits=Limits(max_frame_bytes=f.DEFAULT_MAX_FRAME))
    wire.raw(data)
    out = wire.transport.take()
    assert (goaway_code(out), goaway_debug(out)) == (code, why)
    assert wire.ended()


def trailers_block() -> bytes:
    return Encoder().encode([("grpc-status", "0")])


@pytest.mark.parametrize("closed_by", ["refused", "reset", "ended", "malformed"])
def test_trailers_in_flight_for_a_stream_the_server_closed_are_ignored(closed_by: str) -> None:
    """A peer may send a stream's trailers before it hears the stream was refused, reset or ended by
    the server (its trailers and RST_STREAM NO_ERROR crossing them): they are dropped (the HPACK
    table decoded all the same), never taken for a stream opened out of order."""
    wire = Wire(limits=Limits(max_concurrent_streams=1))
    opened = wire.open()
    wire.pump()
    closed = opened
    if closed_by == "refused":
        closed = opened + 2
        wire.raw(f.frame(f.HEADERS, f.END_HEADERS, closed, header_block()))  # one stream too many
    elif closed_by == "reset":
        wire.raw(f.window_update(opened, 0))  # a stream error: RST_STREAM PROTOCOL_ERROR
    elif closed_by == "malformed":  # a request the server reset at its headers
        wire.raw(f.window_update(opened, 0))  # (its slot freed first)
        wire.transport.take()
        closed = opened + 2
        wire.raw(f.frame(f.HEADERS, f.END_HEADERS, closed, Encoder().encode([(":path", PATH)])))
        assert resets_in(wire.transport.take()) == {closed: f.PROTOCOL_ERROR}
    else:
        wire.send(opened, b"end")  # the handler ends it while the peer is still open
        wire.pump()
        assert wire.results[opened].reset == f.NO_ERROR
    before = wire.transport.mark()
    wire.raw(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, closed, trailers_block()))
    assert goaway_code(wire.transport.since(before)) is None
    assert not wire.transport.closed


def test_a_header_block_of_exactly_twice_the_header_list_limit_is_still_read() -> None:
    """The block is cut off only past twice the limit (HPACK may take up to twice a list's size)."""
    wire = Wire(limits=Limits(max_frame_bytes=f.DEFAULT_MAX_FRAME))
    whole = 2 * Limits().max_header_list_bytes
    frames = f.frame(f.HEADERS, 0, 1, b"\x00" * f.DEFAULT_MAX_FRAME)
    for _ in range(whole // f.DEFAULT_MAX_FRAME - 1):
        frames += f.frame(f.CONTINUATION, 0, 1, b"\x00" * f.DEFAULT_MAX_FRAME)
    wire.raw(frames)  # exactly `whole` bytes, the block not ended yet
    assert goaway_code(wire.transport.take()) is None


def test_a_header_block_in_many_continuation_frames_spends_no_empty_frame_budget() -> None:
    """Only empty CONTINUATION frames (which carry nothing) count against the empty-frame rate."""
    wire = Wire(limits=Limits(empty_frames_per_second=1))
    block = header_block()
    pieces = [block[i : i + 4] for i in range(0, len(block), 4)]
    assert len(pieces) > 3
    frames = f.frame(f.HEADERS, 0, 1, pieces[0])
    frames += b"".join(f.frame(f.CONTINUATION, 0, 1, piece) for piece in pieces[1:-1])
    frames += f.frame(f.CONTINUATION, f.END_HEADERS, 1, pieces[-1])
    wire.raw(frames + f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"end")))
    out = wire.transport.take()
    assert goaway_code(out) is None
    assert [h.messages for h in wire.recorder.handlers] == [[b"end"]]


@pytest.mark.parametrize(
    ("refusal", "why"),
    [(f.NO_ERROR, "the server is stopping"), (f.ENHANCE_YOUR_CALM, "too many connections")],
    ids=["stopping", "over-the-connection-cap"],
)
def test_a_refused_connection_is_told_why_and_nothing_it_sends_is_read(refusal: int, why: str) -> None:
    transport = FakeTransport()
    server = Connection({}, Limits(), on_made=lambda _: refusal)
    server.connection_made(transport)  # type: ignore[arg-type]
    out = transport.take()
    assert frames_in(out)[0][0] == f.SETTINGS  # a GOAWAY must follow SETTINGS (RFC 9113 §3.4)
    assert (goaway_code(out), goaway_debug(out)) == (refusal, why)
    assert frames_in(out)[1][3][:4] == b"\x00\x00\x00\x00"  # last stream 0: no stream was served
    assert transport.closed
    server.data_received(f.PREFACE + f.settings_frame({}) + f.frame(f.PING, 0, 0, b"12345678"))
    assert transport.take() == b""


@pytest.mark.parametrize(
    "start",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http/1.1-request"),
        pytest.param(b"GET /", id="fewer-bytes-than-the-preface"),
    ],
)
def test_a_connection_without_the_http2_preface_is_refused(start: bytes) -> None:
    transport = FakeTransport()
    server = Connection({}, Limits())
    server.connection_made(transport)  # type: ignore[arg-type]
    server.data_received(start)
    out = transport.take()
    assert (goaway_code(out), goaway_debug(out)) == (f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
    assert transport.closed


def test_a_broken_stream_does_not_end_the_connection() -> None:
    wire = Wire()
    sid = wire.open()
    wire.send(sid, b"end")  # the server ends the stream and resets the client's half
    wire.pump()
    assert wire.results[sid].reset == f.NO_ERROR
    wire.raw(f.window_update(sid, 5))  # a stream we closed: frames in flight are expected
    wire.raw(f.frame(f.DATA, 0, sid, b"late"))
    assert not wire.transport.closed
    other = wire.open()
    wire.send(other, b"two", end=True)
    wire.pump()
    assert wire.results[other].replies == [b"re:two"]


def test_a_header_block_repeated_after_the_table_changed_is_decoded_again() -> None:
    """Decoded blocks are remembered only while the HPACK table stays as it was (Envoy's blocks repeat)."""
    path, other = PATH.encode(), b"/other.Service/Method"

    def indexed_path(value: bytes) -> bytes:  # ":path: value", literal with incremental indexing
        return b"\x44" + bytes([len(value)]) + value

    first = b"\x83\x86" + indexed_path(path)  # adds (:path, PATH) as dynamic entry 62
    repeat = b"\x83\x86\xbe"  # :method POST, :scheme http, dynamic entry 62
    wire = Wire()
    for stream_id, block in (
        (1, first),
        (3, repeat),
        (5, repeat),
        (7, b"\x83\x86" + indexed_path(other)),
        (9, repeat),
    ):
        wire.raw(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, block))
    assert len(wire.recorder.handlers) == 3  # streams 1, 3, 5; stream 7 named another method...
    unimplemented = [
        sid for kind, _, sid, payload in frames_in(wire.transport.take()) if b"grpc-status\x0212" in payload
    ]
    assert unimplemented == [7, 9]  # ...and so did stream 9: entry 62 is now that path


def test_a_block_that_changes_the_table_changes_it_every_time_it_is_sent() -> None:
    """The same bytes inserting an entry twice leave two entries: such a block is never answered from
    the cache, or the server's table falls out of step with the peer's."""

    def indexed_path(value: bytes) -> bytes:  # ":path: value", literal with incremental indexing
        return b"\x83\x86\x44" + bytes([len(value)]) + value

    other = b"/other.Service/Method"
    wire = Wire()
    for stream_id, block in (
        (1, indexed_path(other)),  # dynamic table: 62 other
        (3, indexed_path(PATH.encode())),  # 62 PATH, 63 other
        (5, indexed_path(PATH.encode())),  # 62 PATH, 63 PATH, 64 other
        (7, b"\x83\x86\xbf"),  # entry 63: PATH
        (9, b"\x83\x86\xc0"),  # entry 64: the other path
    ):
        wire.raw(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, block))
    out = wire.transport.take()
    assert goaway_code(out) is None
    unimplemented = [sid for kind, _, sid, payload in frames_in(out) if b"grpc-status\x0212" in payload]
    assert unimplemented == [1, 9]


def test_messages_held_behind_a_suspended_handle_give_their_window_back_once_handled() -> None:
    asyncio.run(_test_messages_held_behind_a_suspended_handle_give_their_window_back_once_handled())


WINDOW = 65_535
HELD = [bytes([65 + i]) * 12_000 for i in range(4)]  # 48 KiB with their prefixes: past half a window


async def _test_messages_held_behind_a_suspended_handle_give_their_window_back_once_handled() -> None:
    """While a handler waits, the messages queued behind it keep the peer's stream window spent (the
    server holds no more than the window); once they are handled it is credited back exactly, so the
    peer can fill the whole window again, and again."""
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate), Limits(stream_window=WINDOW, connection_window=WINDOW))
    sid = wire.open()
    wire.send(sid, b"wait", *HELD)
    wire.pump()
    # The handled message is credited at once, the held ones not yet.
    assert wire.client.local_flow_control_window(sid) == WINDOW - 4 * 12_005
    gate.set_result(None)
    await wire.settle()
    assert wire.recorder.handlers[0].messages == [b"wait", *HELD]
    assert wire.client.local_flow_control_window(sid) == WINDOW  # all of it, to the byte
    for _ in range(2):  # the whole window, twice: the server's own count agrees with the peer's
        wire.send(sid, *HELD, b"x" * (WINDOW - 5 * 12_005 - 5))
        await wire.settle()
        assert wire.results[sid].reset is None
        assert wire.client.local_flow_control_window(sid) == WINDOW
    wire.send(sid, b"end", end=True)
    await wire.settle()
    assert wire.results[sid].status == 0
    assert len(wire.recorder.handlers[0].messages) == 1 + 4 + 2 * 5 + 1


def test_a_few_bytes_held_behind_a_suspended_handle_are_credited_in_one_update_later() -> None:
    asyncio.run(_test_a_few_bytes_held_behind_a_suspended_handle_are_credited_in_one_update_later())


async def _test_a_few_bytes_held_behind_a_suspended_handle_are_credited_in_one_update_later() -> None:
    """No WINDOW_UPDATE per small message (a frame per request would double the control traffic):
    credit is owed until the window is half spent, then given back in one update."""
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate), Limits(stream_window=WINDOW, connection_window=WINDOW))
    sid = wire.open()
    wire.send(sid, b"wait", b"one", b"two")
    wire.pump()
    gate.set_result(None)
    await wire.settle()
    assert wire.recorder.handlers[0].messages == [b"wait", b"one", b"two"]
    updates = [e for e in wire.events if isinstance(e, h2.events.WindowUpdated) and e.stream_id == sid]
    assert updates == []
    assert wire.client.local_flow_control_window(sid) == WINDOW - 3 * 5 - 4 - 3 - 3


def test_no_window_update_for_a_stream_the_peer_has_ended() -> None:
    asyncio.run(_test_no_window_update_for_a_stream_the_peer_has_ended())


async def _test_no_window_update_for_a_stream_the_peer_has_ended() -> None:
    """Messages held behind a suspended handle on a stream the peer has finished sending on: handled,
    answered, and no stream credit sent (the peer has nothing more to send on it)."""
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate), Limits(stream_window=WINDOW, connection_window=WINDOW))
    sid = wire.open()
    wire.send(sid, b"wait", *HELD, end=True)
    wire.pump()
    gate.set_result(None)
    await wire.settle()
    assert wire.results[sid].replies == [b"re:wait", *(b"re:" + m for m in HELD)]
    assert (wire.results[sid].status, wire.results[sid].message) == (0, "")
    assert [
        frame
        for frame in frames_in(b"".join(wire.transport.written))
        if frame[0] == f.WINDOW_UPDATE and frame[2] == sid
    ] == []


def test_a_resumed_handle_s_replies_go_out_in_one_write() -> None:
    asyncio.run(_test_a_resumed_handle_s_replies_go_out_in_one_write())


async def _test_a_resumed_handle_s_replies_go_out_in_one_write() -> None:
    """What a resumed handle and the messages queued behind it produce (headers, replies, trailers)
    leaves in one write, one system call, as a pass over received bytes does."""
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate))
    sid = wire.open()
    wire.send(sid, b"wait", b"two", b"three", end=True)
    wire.pump()
    gate.set_result(None)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(wire.transport.chunks) == 1
    wire.pump()
    assert wire.results[sid].replies == [b"re:wait", b"re:two", b"re:three"]
    assert wire.server._tasks == set()  # a finished handle's task is not kept (memory stays bounded)


def test_a_handler_that_fails_while_being_cancelled_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asyncio.run(_test_a_handler_that_fails_while_being_cancelled_is_logged_with_its_traceback(caplog))


async def _test_a_handler_that_fails_while_being_cancelled_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate, fail_when_cancelled=True))
    sid = wire.open()
    wire.send(sid, b"wait")
    wire.pump()
    with caplog.at_level(logging.ERROR, logger="epp.h2.connection"):
        wire.client.reset_stream(sid, f.CANCEL)  # before the handle's task ever ran
        wire.pump()
        await wire.settle()
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith(
        "a cancelled gRPC stream handler failed:\nTraceback (most recent call last):\n  File "
    )
    assert message.endswith("RuntimeError: clean-up failed\n")
    assert wire.recorder.handlers[0].closed == 1
    assert wire.server.open_streams == 0
    gate.cancel()


def test_a_connection_window_raised_to_exactly_2_31_minus_1_is_legal() -> None:
    wire = Wire()
    wire.raw(f.window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW))
    out = wire.transport.take()
    assert goaway_code(out) is None
    assert not wire.transport.closed


@pytest.mark.parametrize(
    ("increment", "reset"),
    [
        pytest.param(f.MAX_WINDOW - f.DEFAULT_WINDOW, None, id="to-exactly-2^31-1"),
        pytest.param(f.MAX_WINDOW - f.DEFAULT_WINDOW + 1, f.FLOW_CONTROL_ERROR, id="past-2^31-1"),
        pytest.param(0, f.PROTOCOL_ERROR, id="of-0"),
    ],
)
def test_a_stream_window_update_past_2_31_minus_1_or_of_0_resets_only_that_stream(
    increment: int, reset: int | None
) -> None:
    """RFC 9113 §6.9.1: a stream's window over 2^31-1 is a stream error FLOW_CONTROL_ERROR, §6.9 an
    increment of 0 a stream error PROTOCOL_ERROR; the connection serves on either way."""
    wire = Wire()
    sid = wire.open()
    wire.pump()
    wire.raw(f.window_update(sid, increment))
    out = wire.transport.take()
    assert resets_in(out) == ({} if reset is None else {sid: reset})
    assert goaway_code(out) is None
    other = wire.open()
    wire.send(other, b"end")
    wire.pump()
    assert wire.results[other].replies == [b"re:end"]


def test_a_stream_finished_while_its_handle_is_suspended_closes_its_handler_once_the_handle_returns() -> None:
    asyncio.run(_test_a_stream_finished_while_its_handle_is_suspended_closes_its_handler_once_it_returns())


async def _test_a_stream_finished_while_its_handle_is_suspended_closes_its_handler_once_it_returns() -> None:
    wire, sid, gate = suspended_stream()
    await wire.settle()
    wire.client.send_data(sid, grpc_message(b"zipped", compressed=True))
    await wire.settle()  # the stream's status is decided (UNIMPLEMENTED) while handle() waits
    (handler,) = wire.recorder.handlers
    assert handler.closed == 0  # never closed under a suspended handle()
    gate.set_result(None)
    await wire.settle()
    assert handler.closed == 1
    assert wire.results[sid].status == 12
    assert wire.server.open_streams == 0


def test_a_handler_whose_close_fails_is_logged_with_its_traceback_and_the_connection_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wire = Wire(Script(close_fails=True))
    sid = wire.open()
    with caplog.at_level(logging.ERROR, logger="epp.h2.connection"):
        wire.send(sid, b"end")
        wire.pump()
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("closing a gRPC stream failed:\nTraceback (most recent call last):\n  File ")
    assert message.endswith("RuntimeError: close failed\n")
    assert wire.results[sid].status == 0
    other = wire.open()
    wire.send(other, b"end")
    wire.pump()
    assert wire.results[other].replies == [b"re:end"]
    assert [h.closed for h in wire.recorder.handlers] == [1, 1]


def test_a_stream_finished_but_held_by_the_peer_s_window_is_closed_once_when_the_connection_drops() -> None:
    """Its handler is closed as its status is decided; losing the connection before the reply and
    trailers could be sent drops the stream without closing the handler again."""
    big = b"x" * (f.DEFAULT_WINDOW + 1)  # its reply cannot fit the peer's default window
    wire = Wire(Script(end_on=big), ack_data=False)
    sid = wire.open()
    wire.send_bytes(sid, grpc_message(big))
    wire.pump()
    assert wire.results[sid].status is None  # the reply waits for window the peer never gives
    (handler,) = wire.recorder.handlers
    assert handler.closed == 1
    wire.lose()
    assert handler.closed == 1
    assert wire.server.open_streams == 0


def test_messages_split_across_frames_give_the_connection_window_back_to_the_byte() -> None:
    """Messages larger than a frame go through the reassembly path, not the one-frame fast path; the
    connection window they spend comes back in full once less than half is left, so the server's count
    and the peer's agree after round after round (a byte lost per round would starve the peer)."""
    limits = Limits(
        max_frame_bytes=f.DEFAULT_MAX_FRAME,
        max_message_bytes=32_768,
        stream_window=WINDOW,
        connection_window=WINDOW,
    )
    wire = Wire(limits=limits)
    window = wire.client.outbound_flow_control_window
    assert window == limits.effective_connection_window
    sid = wire.open()
    message = b"m" * 20_000  # two DATA frames each
    spent = 5 + len(message)
    available, owed = window, 0  # the window as RFC 9113 and this server's rule say it must go
    handled = updates = 0
    while updates < 3:
        wire.send_bytes(sid, grpc_message(message))
        before = wire.transport.mark()
        wire.pump()
        handled += 1
        available, owed = available - spent, owed + spent
        expected = []
        if available < window >> 1:  # less than half left: everything owed, in one update
            expected, available, owed = [owed], available + owed, 0
        increments = [n for stream, n in window_updates(wire.transport.since(before)) if stream == 0]
        assert increments == expected
        updates += len(increments)
        assert (wire.server._inflow.available, wire.server._inflow.owed) == (available, owed)
        assert wire.client.outbound_flow_control_window == available  # the peer's count agrees
    assert wire.results[sid].reset is None
    assert len(wire.recorder.handlers[0].messages) == handled
