"""`epp.h2.Connection`'s limits (issue 21): stream limit, windows credited as consumed, frame rates,
control replies behind a peer that does not read, timeouts (on a fake clock), and the RFC 9113 stream
states it now enforces. Raw frames where the `h2` client would refuse to write them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import h2.settings
import pytest

from epp.h2 import frames as f
from epp.h2.connection import Connection, Limits
from epp.h2.limits import GOAWAY_GRACE, WAITING_STREAM_WINDOWS

from .support import (
    FakeClock,
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
)

UNKNOWN_PATH = "/other.Service/Method"


def headers(stream_id: int, end_stream: bool = False, path: str | None = None) -> bytes:
    flags = f.END_HEADERS | (f.END_STREAM if end_stream else 0)
    return f.frame(f.HEADERS, flags, stream_id, header_block(path) if path else header_block())


def data(stream_id: int, payload: bytes, end_stream: bool = False) -> bytes:
    return f.frame(f.DATA, f.END_STREAM if end_stream else 0, stream_id, payload)


def ping(n: int = 0) -> bytes:
    return f.frame(f.PING, 0, 0, n.to_bytes(8, "big"))


def goaways(out: bytes) -> list[tuple[int, int]]:
    """(last stream id, code) of every GOAWAY in raw server output."""
    return [
        (f.U32.unpack_from(p, 0)[0], f.U32.unpack_from(p, 4)[0])
        for k, _, _, p in frames_in(out)
        if k == f.GOAWAY
    ]


# --- what is advertised, and the stream limit ------------------------------------------------------
def test_settings_advertise_the_stream_limit_and_the_windows() -> None:
    limits = Limits(max_concurrent_streams=7, stream_window=100_000)
    wire = Wire(limits=limits)
    remote = wire.client.remote_settings
    assert remote.max_concurrent_streams == 7
    assert remote.initial_window_size == 100_000
    assert remote.enable_push == 0
    assert wire.client.outbound_flow_control_window == limits.effective_connection_window == 16 * 1024 * 1024


MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("limits", "window", "waiting", "budget"),
    [
        # The EPP's: a 16 MiB body limit (+1 MiB), 256 KiB stream windows and frames: 19.25 MiB at most.
        pytest.param(
            Limits(max_message_bytes=17 * MiB),
            17 * MiB + 5 + 2 * MiB + MiB // 4,
            2 * MiB,
            17 * MiB + 5,
            id="epp",
        ),
        pytest.param(Limits(), 16 * MiB, 2 * MiB, 14 * MiB - MiB // 4, id="defaults-the-window-as-set"),
        pytest.param(
            Limits(
                max_message_bytes=100, stream_window=65_535, max_frame_bytes=16_384, connection_window=65_535
            ),
            105 + 8 * 65_535 + 16_384,
            8 * 65_535,
            105,
            id="small-raised-to-one-message",
        ),
    ],
)
def test_the_connection_window_holds_a_largest_message_what_waits_and_a_frame(
    limits: Limits, window: int, waiting: int, budget: int
) -> None:
    assert (limits.effective_connection_window, limits.waiting_bytes, limits.reservation_budget) == (
        window,
        waiting,
        budget,
    )


def test_a_stream_past_the_limit_is_refused_and_the_others_are_served() -> None:
    wire = Wire(limits=Limits(max_concurrent_streams=2))
    wire.transport.take()
    wire.raw(headers(1) + headers(3) + headers(5))
    assert resets_in(wire.transport.take()) == {5: f.REFUSED_STREAM}
    wire.raw(data(1, grpc_message(b"one"), end_stream=True))
    wire.raw(headers(7) + data(7, grpc_message(b"seven"), end_stream=True))
    out = wire.transport.take()
    assert resets_in(out) == {}
    assert goaway_code(out) is None
    assert [h.messages for h in wire.recorder.handlers] == [[b"one"], [], [b"seven"]]


def test_refused_streams_count_against_the_reset_rate() -> None:
    wire = Wire(limits=Limits(max_concurrent_streams=1, resets_per_second=2))
    wire.raw(headers(1) + headers(3) + headers(5))
    assert goaway_code(wire.transport.take()) is None
    wire.raw(headers(7))
    out = wire.transport.take()
    assert (goaway_code(out), goaway_debug(out)) == (
        f.ENHANCE_YOUR_CALM,
        "refused streams over the rate limit",
    )
    assert wire.ended()


# --- receive windows -------------------------------------------------------------------------------
def test_incomplete_messages_hold_connection_credit_until_they_are_complete() -> None:
    limits = Limits(max_message_bytes=250_000, max_frame_bytes=16_384, connection_window=65_535)
    wire = Wire(limits=limits)
    window = limits.effective_connection_window  # topped up once less than half is left
    assert wire.client.outbound_flow_control_window == window
    first, second = wire.open(), wire.open()
    message = grpc_message(b"m" * 250_000)
    for sid in (first, second):
        wire.send_bytes(sid, message[:150_000])
    wire.pump()
    assert wire.client.outbound_flow_control_window == window - 300_000  # nothing given back yet
    for sid in (first, second):
        wire.send_bytes(sid, message[150_000:], end=True)
    wire.pump()
    # Credit came back once the messages were handed over (the last of it waits for the next half).
    assert wire.client.outbound_flow_control_window > window // 2
    assert wire.results[first].replies == wire.results[second].replies == [b"re:" + b"m" * 250_000]


# A reservation budget of one 100,000-byte message; WAITING_STREAM_WINDOWS (8) stream windows of
# 65,535 may wait beside it.
W = WAITING_STREAM_WINDOWS
ONE_RESERVATION = Limits(
    max_message_bytes=100_000, max_frame_bytes=16_384, stream_window=65_535, connection_window=65_535
)


def test_a_message_longer_than_its_stream_window_gets_the_window_widened_and_then_back_to_normal() -> None:
    wire = Wire(limits=ONE_RESERVATION)
    sid = wire.open()
    big = grpc_message(b"b" * 100_000)
    wire.send_bytes(sid, big[:16_384])
    wire.pump()
    # Widened for the whole message (the h2 client would refuse to send past the window otherwise).
    assert wire.client.local_flow_control_window(sid) == len(big) - 16_384
    wire.send_bytes(sid, big[16_384:])
    wire.pump()
    assert wire.results[sid].replies == [b"re:" + b"b" * 100_000]
    assert wire.client.local_flow_control_window(sid) == 65_535  # what was lent is not given back
    wire.send(sid, b"after", end=True)
    wire.pump()
    assert wire.results[sid].replies[-1] == b"re:after"


def test_whole_messages_give_connection_and_stream_credit_back_as_they_are_handed_over() -> None:
    limits = Limits(
        max_message_bytes=20_000, max_frame_bytes=16_384, stream_window=65_535, connection_window=65_535
    )
    wire = Wire(limits=limits)
    sid = wire.open()
    window = limits.effective_connection_window
    for n in range(2 * window // 16_005 + 1):  # twice the connection window, a frame per message
        wire.send(sid, b"%05d" % n + b"w" * 15_995)
        wire.pump()
    assert len(wire.results[sid].replies) == 2 * window // 16_005 + 1
    assert wire.client.outbound_flow_control_window > window // 2
    assert wire.client.local_flow_control_window(sid) > 65_535 // 2
    assert wire.goaway is None


def test_stream_credit_for_an_incomplete_message_waits_until_it_is_complete() -> None:
    wire = Wire(limits=Limits(stream_window=65_535, max_frame_bytes=16_384))
    sid = wire.open()
    message = grpc_message(b"c" * 60_000)
    wire.send_bytes(sid, message[:40_000])  # less than half the window left: credit would be due
    wire.pump()
    assert wire.client.local_flow_control_window(sid) == 65_535 - 40_000  # nothing given back yet
    wire.send_bytes(sid, message[40_000:])
    wire.pump()
    assert wire.results[sid].replies == [b"re:" + b"c" * 60_000]
    assert wire.client.local_flow_control_window(sid) == 65_535


def test_a_message_the_budget_cannot_hold_waits_within_its_window_and_goes_on_when_one_is_done() -> None:
    wire = Wire(limits=ONE_RESERVATION)
    first, second, third = wire.open(), wire.open(), wire.open()
    big = grpc_message(b"a" * 100_000)
    for sid in (first, second, third):
        wire.send_bytes(sid, big[:30_000])
    wire.pump()
    assert wire.client.local_flow_control_window(first) == len(big) - 30_000  # reserved
    assert wire.client.local_flow_control_window(second) == 65_535 - 30_000  # waiting, in order
    assert wire.client.local_flow_control_window(third) == 65_535 - 30_000
    wire.send_bytes(first, big[30_000:])
    wire.pump()
    assert wire.client.local_flow_control_window(second) == len(big) - 30_000  # its turn
    assert wire.client.local_flow_control_window(third) == 65_535 - 30_000
    for sid in (second, third):
        wire.send_bytes(sid, big[30_000:])
        wire.pump()
    assert [wire.results[sid].replies for sid in (first, second, third)] == [[b"re:" + b"a" * 100_000]] * 3
    assert wire.goaway is None


def test_messages_waiting_past_the_limit_end_the_stream_that_adds_more_and_the_others_complete() -> None:
    wire = Wire(limits=ONE_RESERVATION)
    big = grpc_message(b"a" * 100_000)
    reserved = wire.open()
    wire.send_bytes(reserved, big[:10_000])
    waiting = [wire.open() for _ in range(W + 1)]
    for sid in waiting:
        wire.send_bytes(sid, big[:65_535])  # W of them: exactly the W x 65,535 that may wait
    wire.pump()
    assert [wire.results[sid].status for sid in waiting] == [None] * W + [8]
    assert wire.results[waiting[-1]].message == (
        "too many incomplete messages wait for the connection's flow-control window"
    )
    # The window still holds the reserved message beside all that waits: the connection never stalls.
    for sid in [reserved, *waiting[:-1]]:
        wire.send_bytes(sid, big[65_535 if sid != reserved else 10_000 :])
        wire.pump()
    assert all(wire.results[sid].replies == [b"re:" + b"a" * 100_000] for sid in [reserved, *waiting[:-1]])
    assert wire.goaway is None


def test_credit_for_a_suspended_stream_waits_until_its_handle_returns() -> None:
    asyncio.run(_test_credit_for_a_suspended_stream_waits_until_its_handle_returns())


async def _test_credit_for_a_suspended_stream_waits_until_its_handle_returns() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate), limits=Limits(stream_window=65_535))
    sid = wire.open()
    wire.send(sid, b"wait")
    wire.pump()
    wire.send(sid, b"q" * 40_000)
    wire.pump()
    assert wire.client.local_flow_control_window(sid) < 65_535 - 40_000  # no credit while suspended
    gate.set_result(None)
    await wire.settle()
    assert wire.client.local_flow_control_window(sid) == 65_535
    assert wire.recorder.handlers[0].messages == [b"wait", b"q" * 40_000]


def test_data_up_to_the_connection_window_is_taken_and_a_byte_past_it_is_a_flow_control_error() -> None:
    asyncio.run(_test_data_up_to_the_connection_window_is_taken_and_a_byte_past_it())


async def _test_data_up_to_the_connection_window_is_taken_and_a_byte_past_it() -> None:
    """Whole messages queued behind suspended handles are held, so the peer can spend the
    connection window to its last byte (no error: RFC 9113 §6.9.1 allows exactly the window); one
    more byte ends the connection with FLOW_CONTROL_ERROR, saying why."""
    limits = Limits(
        max_message_bytes=100, max_frame_bytes=16_384, stream_window=65_535, connection_window=65_535
    )
    assert limits.effective_connection_window == 105 + W * 65_535 + 16_384
    wire, sid, gate = suspended_stream(limits)
    sids = [sid]
    for _ in range(W):
        sids.append(wire.open())
        wire.send(sids[-1], b"wait")
    wire.pump()
    wire.transport.take()
    for sid in sids[:W]:  # whole messages queued behind the handles: W x 65,520 bytes
        wire.raw(data(sid, grpc_message(b"x" * 100) * 156) * 4)
    left = wire.server._inflow.available
    assert 16_384 < left < 65_535 - 4  # the last stream can take it all
    messages = []  # messages of 105 bytes at most (the limit, 100, and the prefix), `left` in all
    while left > 0:
        size = left if left <= 105 else 55 if left <= 110 else 105  # never a piece under 5 bytes
        messages.append(grpc_message(b"x" * (size - 5)))
        left -= size
    for start in range(0, len(messages), 156):  # frames of whole messages, none over 16,384 bytes
        wire.raw(data(sids[W], b"".join(messages[start : start + 156])))
    assert (wire.server._inflow.available, goaway_code(wire.transport.take())) == (0, None)
    wire.raw(data(sids[W], b"z"))
    out = wire.transport.take()
    assert (goaway_code(out), goaway_debug(out)) == (
        f.FLOW_CONTROL_ERROR,
        "the peer overran the connection window",
    )
    assert wire.ended()
    wire.lose()
    gate.cancel()
    await wire.server.wait_closed()


def test_data_past_a_stream_window_resets_only_that_stream() -> None:
    asyncio.run(_test_data_past_a_stream_window_resets_only_that_stream())


async def _test_data_past_a_stream_window_resets_only_that_stream() -> None:
    wire, sid, gate = suspended_stream(Limits(stream_window=65_535))
    frame = data(sid, grpc_message(b"x" * 16_000))
    wire.raw(frame * 5)
    out = wire.transport.take()
    assert resets_in(out) == {sid: f.FLOW_CONTROL_ERROR}
    assert goaway_code(out) is None
    other = wire.open()
    wire.send(other, b"fine", end=True)
    wire.pump()
    assert wire.results[other].replies == [b"re:fine"]
    gate.cancel()
    await wire.settle()


# --- frame rates and caps ----------------------------------------------------------------------------
def _stream_and(*frames: bytes) -> bytes:
    return headers(1) + b"".join(frames)


OPEN_HEADERS = f.frame(f.HEADERS, 0, 1, header_block())
FLOODS = [
    pytest.param(Limits(pings_per_second=5), ping() * 5, None, None, id="pings-at-the-rate"),
    pytest.param(
        Limits(pings_per_second=5),
        ping() * 6,
        f.ENHANCE_YOUR_CALM,
        "PING over the rate limit",
        id="pings-over-the-rate",
    ),
    # The client's own SETTINGS at the start took one of the four.
    pytest.param(
        Limits(settings_per_second=4), f.settings_frame({}) * 3, None, None, id="settings-at-the-rate"
    ),
    pytest.param(
        Limits(settings_per_second=4),
        f.settings_frame({}) * 4,
        f.ENHANCE_YOUR_CALM,
        "SETTINGS over the rate limit",
        id="settings-over-the-rate",
    ),
    pytest.param(
        Limits(resets_per_second=3),
        b"".join(headers(i) + f.rst_stream(i, f.CANCEL) for i in (1, 3, 5)),
        None,
        None,
        id="resets-at-the-rate",
    ),
    pytest.param(
        Limits(resets_per_second=3),
        b"".join(headers(i) + f.rst_stream(i, f.CANCEL) for i in (1, 3, 5, 7)),
        f.ENHANCE_YOUR_CALM,
        "RST_STREAM over the rate limit",
        id="rapid-reset",
    ),
    # Envoy resets each ext_proc stream it has had its answers on, once per request: never a flood.
    pytest.param(
        Limits(resets_per_second=3),
        b"".join(
            headers(i) + data(i, grpc_message(b"ask")) + f.rst_stream(i, f.CANCEL) for i in range(1, 41, 2)
        ),
        None,
        None,
        id="resets-of-answered-streams",
    ),
    pytest.param(
        Limits(resets_per_second=3),
        b"".join(
            headers(i) + data(i, grpc_message(b"silent")) + f.rst_stream(i, f.CANCEL) for i in (1, 3, 5, 7)
        ),
        f.ENHANCE_YOUR_CALM,
        "RST_STREAM over the rate limit",
        id="resets-of-streams-fed-but-not-answered",
    ),
    pytest.param(
        Limits(resets_per_second=3),
        b"".join(
            headers(i) + data(i, grpc_message(b"end"), end_stream=True) + f.rst_stream(i, f.CANCEL)
            for i in range(1, 41, 2)
        ),
        None,
        None,
        id="resets-of-finished-streams",
    ),
    pytest.param(
        Limits(empty_frames_per_second=3),
        _stream_and(data(1, b"") * 3),
        None,
        None,
        id="empty-data-at-the-rate",
    ),
    pytest.param(
        Limits(empty_frames_per_second=3),
        _stream_and(data(1, b"") * 4),
        f.ENHANCE_YOUR_CALM,
        "empty frames over the rate limit",
        id="empty-data-flood",
    ),
    pytest.param(
        Limits(empty_frames_per_second=1000),
        _stream_and(data(1, b"", end_stream=True) * 1),
        None,
        None,
        id="empty-end",
    ),
    pytest.param(
        Limits(empty_frames_per_second=3, max_continuation_frames=100),
        OPEN_HEADERS + f.frame(f.CONTINUATION, 0, 1, b"") * 4,
        f.ENHANCE_YOUR_CALM,
        "empty frames over the rate limit",
        id="empty-continuation-flood",
    ),
    pytest.param(
        Limits(max_continuation_frames=3),
        OPEN_HEADERS + f.frame(f.CONTINUATION, 0, 1, b"\x82") * 3,
        None,
        None,
        id="continuations-at-the-cap",
    ),
    pytest.param(
        Limits(max_continuation_frames=3),
        OPEN_HEADERS + f.frame(f.CONTINUATION, 0, 1, b"\x82") * 4,
        f.ENHANCE_YOUR_CALM,
        "too many CONTINUATION frames in a header block",
        id="continuation-flood",
    ),
]


@pytest.mark.parametrize(("limits", "flood", "code", "why"), FLOODS)
def test_a_flood_past_its_rate_or_cap_ends_the_connection_calmly(
    limits: Limits, flood: bytes, code: int | None, why: str | None
) -> None:
    wire = Wire(limits=limits)
    wire.transport.take()
    wire.raw(flood)
    out = wire.transport.take()
    assert (goaway_code(out), goaway_debug(out)) == (code, why)
    assert wire.ended() is (code is not None)


def test_rates_refill_with_time() -> None:
    wire = Wire(limits=Limits(pings_per_second=5))
    wire.raw(ping() * 5)
    wire.clock.advance(1.0)
    wire.raw(ping() * 5)
    assert goaway_code(wire.transport.take()) is None
    assert not wire.transport.closed


# --- a peer that does not read -----------------------------------------------------------------------
UNLIMITED_PINGS = Limits(pings_per_second=10**9, max_queued_control_frames=20)


def test_control_replies_queued_to_a_peer_that_does_not_read_are_capped() -> None:
    wire = Wire(limits=UNLIMITED_PINGS)
    wire.transport.buffered = 1  # what was written is still in the buffer
    wire.raw(ping() * 20)  # exactly the cap: still served
    assert goaway_code(wire.transport.take()) is None
    wire.raw(ping())
    out = wire.transport.take()
    assert (goaway_code(out), goaway_debug(out)) == (
        f.ENHANCE_YOUR_CALM,
        "too many control replies queued to a peer that does not read",
    )
    assert wire.ended()


def test_the_largest_frame_size_a_peer_may_announce_is_accepted() -> None:
    """SETTINGS_MAX_FRAME_SIZE may be 2^24-1 (RFC 9113 §6.5.2); one more is a PROTOCOL_ERROR."""
    wire = Wire()
    wire.raw(f.settings_frame({f.SETTINGS_MAX_FRAME_SIZE: f.MAX_FRAME_LIMIT}))
    assert goaway_code(wire.transport.take()) is None
    wire.raw(f.settings_frame({f.SETTINGS_MAX_FRAME_SIZE: f.MAX_FRAME_LIMIT + 1}))
    assert goaway_code(wire.transport.take()) == f.PROTOCOL_ERROR


def test_control_replies_the_peer_has_read_do_not_count() -> None:
    wire = Wire(limits=UNLIMITED_PINGS)
    for _ in range(5):
        wire.raw(ping() * 15)
        assert goaway_code(wire.transport.take()) is None  # read, so the buffer is empty again
    assert not wire.transport.closed


def test_reading_stops_while_the_write_buffer_is_full_and_a_stall_ends_the_connection() -> None:
    wire = Wire(limits=Limits(idle_timeout=30.0, write_buffer_high=4096))
    assert wire.transport.high_water == 4096
    wire.open()  # an open stream: the connection is not idle
    wire.pump()
    wire.server.pause_writing()
    assert not wire.transport.reading
    wire.server.resume_writing()
    assert wire.transport.reading
    wire.server.pause_writing()
    wire.clock.advance(29.0)
    assert not wire.transport.closed
    wire.clock.advance(2.0)
    assert goaway_code(wire.transport.take()) == f.ENHANCE_YOUR_CALM
    assert wire.transport.aborted  # nothing waits for a buffer the peer will never read


def test_a_flood_while_paused_aborts_the_transport() -> None:
    wire = Wire(limits=UNLIMITED_PINGS)
    wire.server.pause_writing()
    wire.transport.buffered = 1
    wire.raw(ping() * 21)
    assert wire.transport.aborted


# --- timeouts ----------------------------------------------------------------------------------------
def test_a_connection_without_a_preface_in_time_is_closed() -> None:
    clock, transport = FakeClock(), FakeTransport()
    server = Connection({}, Limits(preface_timeout=10.0), clock=clock)
    server.connection_made(transport)  # type: ignore[arg-type]
    server.data_received(f.PREFACE[:10])
    clock.advance(9.9)
    assert not transport.closed
    clock.advance(0.2)
    assert goaway_code(transport.take()) == f.ENHANCE_YOUR_CALM
    assert not transport.closed  # the GOAWAY's linger: what the peer sends is read, then it closes
    clock.advance(GOAWAY_GRACE)
    assert transport.closed


def test_the_preface_timer_stops_once_the_preface_arrived() -> None:
    wire = Wire(limits=Limits(preface_timeout=10.0, idle_timeout=0))
    wire.clock.advance(100.0)
    assert not wire.transport.closed
    assert wire.clock.armed == 0


def test_the_preface_timer_stops_at_the_24_bytes_of_the_preface() -> None:
    """The preface timer covers the client's magic; what follows (its SETTINGS) is under the header
    and idle timers like any frame."""
    clock, transport = FakeClock(), FakeTransport()
    server = Connection({}, Limits(preface_timeout=10.0, idle_timeout=0), clock=clock)
    server.connection_made(transport)  # type: ignore[arg-type]
    server.data_received(f.PREFACE)
    clock.advance(100.0)
    assert (goaway_code(transport.take()), transport.closed, clock.armed) == (None, False, 0)


SLOW_HEADERS = [
    pytest.param(f.frame(f.HEADERS, 0, 1, header_block()), id="header-block-without-end"),
    pytest.param(f.frame(f.HEADERS, f.END_HEADERS, 1, header_block())[:12], id="half-a-headers-frame"),
    pytest.param(ping()[:5], id="half-a-frame-header"),
]


@pytest.mark.parametrize("slow", SLOW_HEADERS)
def test_a_header_block_or_frame_left_incomplete_is_closed_in_time(slow: bytes) -> None:
    wire = Wire(limits=Limits(header_timeout=5.0))
    wire.transport.take()
    wire.raw(slow)
    wire.clock.advance(4.9)
    assert not wire.transport.closed
    wire.clock.advance(0.2)
    assert goaway_code(wire.transport.take()) == f.ENHANCE_YOUR_CALM
    assert wire.ended()


@pytest.mark.parametrize("part", [4, 12], ids=["the-frame-header-up-to-its-type", "half-the-payload"])
def test_a_data_frame_arriving_slowly_is_not_held_to_the_header_timeout(part: int) -> None:
    """A message may trickle in (flow control paces it): once the fourth byte says DATA, the frame is
    left to the stream's own pace, not to the header timer."""
    wire = Wire(limits=Limits(header_timeout=5.0, idle_timeout=0))
    sid = wire.open()
    wire.pump()
    wire.transport.take()
    frame = data(sid, grpc_message(b"slowly"))
    wire.raw(frame[:part])
    wire.clock.advance(10.0)
    assert (goaway_code(wire.transport.take()), wire.transport.closed) == (None, False)
    wire.raw(frame[part:])
    assert wire.recorder.handlers[0].messages == [b"slowly"]


def test_a_header_block_finished_in_time_stops_the_timer() -> None:
    wire = Wire(limits=Limits(header_timeout=5.0, idle_timeout=0))
    block = header_block()
    wire.raw(f.frame(f.HEADERS, 0, 1, block[:4]))
    wire.clock.advance(4.0)
    wire.raw(f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[4:]))
    wire.clock.advance(10.0)
    assert not wire.transport.closed
    assert len(wire.recorder.handlers) == 1


def test_an_idle_connection_is_closed_in_two_steps() -> None:
    wire = Wire(limits=Limits(idle_timeout=30.0))
    sid = wire.open()
    wire.send(sid, b"one", end=True)
    wire.pump()
    wire.transport.take()
    wire.clock.advance(29.0)
    assert wire.transport.take() == b""
    wire.clock.advance(1.5)
    assert goaways(wire.transport.take()) == [(2**31 - 1, f.NO_ERROR)]  # streams on their way are served
    assert not wire.transport.closed
    wire.clock.advance(GOAWAY_GRACE)
    assert goaways(wire.transport.take()) == [(sid, f.NO_ERROR)]
    assert wire.ended()


def test_the_idle_time_counts_from_the_last_stream_s_end() -> None:
    """The check armed at the start fires 30 s later, half a second after the last stream ended:
    the connection has been idle for 29.5 s only, so it waits for the rest."""
    wire = Wire(limits=Limits(idle_timeout=30.0))
    wire.transport.take()
    sid = wire.open()
    wire.clock.advance(0.5)
    wire.send(sid, b"one", end=True)
    wire.pump()
    wire.transport.take()
    wire.clock.advance(29.5)
    assert goaways(wire.transport.take()) == []
    wire.clock.advance(0.6)
    assert goaways(wire.transport.take()) == [(2**31 - 1, f.NO_ERROR)]


def test_a_connection_with_an_open_stream_is_not_idle() -> None:
    wire = Wire(limits=Limits(idle_timeout=30.0))
    sid = wire.open()
    wire.send(sid, b"one")
    wire.pump()
    wire.clock.advance(100.0)
    assert not wire.transport.closed
    wire.send(sid, b"two", end=True)
    wire.pump()
    wire.clock.advance(29.0)
    assert not wire.transport.closed
    wire.clock.advance(2.0 + GOAWAY_GRACE)
    assert wire.ended()
    assert wire.results[sid].replies == [b"re:one", b"re:two"]


def test_a_stream_opened_between_the_idle_goaways_is_served_before_the_close() -> None:
    wire = Wire(limits=Limits(idle_timeout=30.0))
    wire.clock.advance(30.5)
    wire.transport.take()
    wire.raw(headers(1) + data(1, grpc_message(b"late")))
    wire.clock.advance(GOAWAY_GRACE)
    assert not wire.transport.closed  # the stream is still open
    wire.raw(data(1, b"", end_stream=True))
    assert wire.ended()
    assert wire.recorder.handlers[0].messages == [b"late"]


# --- stream states (RFC 9113 §5.1) and frame checks ----------------------------------------------------
# With SETTINGS_INITIAL_WINDOW_SIZE 0 the server cannot send its reply: the stream stays half-closed
# (remote) after the client's END_STREAM.
HALF_CLOSED = (
    f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 0})
    + headers(1)
    + data(1, grpc_message(b"x"), end_stream=True)
)
CONNECTION_ERRORS = [
    pytest.param(f.window_update(5, 1), f.PROTOCOL_ERROR, id="window-update-on-an-idle-stream"),
    pytest.param(f.rst_stream(5, f.CANCEL), f.PROTOCOL_ERROR, id="rst-stream-on-an-idle-stream"),
    pytest.param(
        headers(1) + f.frame(f.RST_STREAM, 0, 1, b"\0\0\0"), f.FRAME_SIZE_ERROR, id="rst-stream-length"
    ),
    pytest.param(f.frame(f.RST_STREAM, 0, 0, b"\0\0\0\0"), f.PROTOCOL_ERROR, id="rst-stream-on-stream-0"),
    pytest.param(f.frame(f.PING, 0, 1, b"12345678"), f.PROTOCOL_ERROR, id="ping-on-a-stream"),
    pytest.param(f.frame(f.PRIORITY, 0, 0, b"\0\0\0\1\x10"), f.PROTOCOL_ERROR, id="priority-on-stream-0"),
    pytest.param(f.frame(f.PRIORITY, 0, 3, b"\0\0\0\1"), f.FRAME_SIZE_ERROR, id="priority-length"),
    pytest.param(f.frame(f.PRIORITY, 0, 3, b"\0\0\0\3\x10"), f.PROTOCOL_ERROR, id="priority-on-itself"),
    pytest.param(
        f.frame(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, b"\0\0\0\1\x10" + header_block()),
        f.PROTOCOL_ERROR,
        id="headers-depending-on-itself",
    ),
    pytest.param(f.settings_frame({f.SETTINGS_ENABLE_PUSH: 2}), f.PROTOCOL_ERROR, id="enable-push-2"),
    pytest.param(
        headers(1)
        + f.window_update(1, f.MAX_WINDOW - f.DEFAULT_WINDOW)
        # The stream's window is at 2^31-1: any raise of the initial window overflows it.
        + f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: f.DEFAULT_WINDOW + 1}),
        f.FLOW_CONTROL_ERROR,
        id="initial-window-overflowing-a-stream",
    ),
    pytest.param(headers(1, end_stream=True) + data(1, b"late"), f.STREAM_CLOSED, id="data-after-both-ends"),
    pytest.param(
        headers(1) + f.rst_stream(1, f.CANCEL) + data(1, b"late"),
        f.STREAM_CLOSED,
        id="data-after-a-client-reset",
    ),
    pytest.param(
        headers(1) + f.rst_stream(1, f.CANCEL) + headers(1),
        f.STREAM_CLOSED,
        id="headers-after-a-client-reset",
    ),
    pytest.param(headers(5) + headers(3), f.PROTOCOL_ERROR, id="stream-id-below-one-opened"),
    pytest.param(
        headers(1, path=UNKNOWN_PATH) + f.frame(f.DATA, f.PADDED, 1, b"\x09abc"),
        f.PROTOCOL_ERROR,
        id="bad-padding-on-a-closed-stream",
    ),
]


@pytest.mark.parametrize(("frames", "code"), CONNECTION_ERRORS)
def test_a_frame_the_stream_state_forbids_ends_the_connection(frames: bytes, code: int) -> None:
    wire = Wire()
    wire.transport.take()
    wire.raw(frames)
    assert goaway_code(wire.transport.take()) == code
    assert wire.ended()


STREAM_ERRORS = [
    pytest.param(HALF_CLOSED + data(1, b"more"), f.STREAM_CLOSED, id="data-on-a-half-closed-stream"),
    pytest.param(
        HALF_CLOSED + headers(1, end_stream=True), f.STREAM_CLOSED, id="headers-on-a-half-closed-stream"
    ),
    pytest.param(headers(1) + f.window_update(1, 0), f.PROTOCOL_ERROR, id="window-update-of-0-on-a-stream"),
]


@pytest.mark.parametrize(("frames", "code"), STREAM_ERRORS)
def test_a_frame_a_stream_state_forbids_resets_only_that_stream(frames: bytes, code: int) -> None:
    wire = Wire()
    wire.transport.take()
    wire.raw(frames)
    out = wire.transport.take()
    assert resets_in(out) == {1: code}
    assert goaway_code(out) is None
    wire.raw(headers(3) + data(3, grpc_message(b"next"), end_stream=True))
    assert not wire.transport.closed
    assert wire.recorder.handlers[-1].messages == [b"next"]


IGNORED = [
    pytest.param(
        headers(1, path=UNKNOWN_PATH) + data(1, b"in flight"), id="data-on-a-stream-the-server-reset"
    ),
    pytest.param(
        headers(1, path=UNKNOWN_PATH) + headers(1, end_stream=True),
        id="trailers-on-a-stream-the-server-reset",
    ),
    pytest.param(headers(1, end_stream=True) + f.window_update(1, 5), id="window-update-on-a-closed-stream"),
    pytest.param(headers(1, end_stream=True) + f.rst_stream(1, f.CANCEL), id="rst-stream-on-a-closed-stream"),
    pytest.param(
        headers(1, end_stream=True) + f.frame(f.PRIORITY, 0, 1, b"\0\0\0\0\x10"), id="priority-closed"
    ),
]


@pytest.mark.parametrize("frames", IGNORED)
def test_frames_that_may_have_been_in_flight_are_ignored(frames: bytes) -> None:
    wire = Wire()
    wire.raw(frames)
    wire.raw(headers(3) + data(3, grpc_message(b"next"), end_stream=True))
    assert goaway_code(wire.transport.take()) is None
    assert wire.recorder.handlers[-1].messages == [b"next"]


def test_the_record_of_closed_streams_is_bounded() -> None:
    closed = b"".join(headers(i, end_stream=True) for i in (1, 3, 5))
    recent = Wire(limits=Limits(closed_streams_remembered=2))
    recent.raw(closed + data(3, b"late"))
    assert goaway_code(recent.transport.take()) == f.STREAM_CLOSED
    forgotten = Wire(limits=Limits(closed_streams_remembered=2))
    forgotten.raw(closed + data(1, b"late"))  # stream 1 is no longer remembered: taken as in flight
    assert goaway_code(forgotten.transport.take()) is None
    assert not forgotten.transport.closed


# --- no control frame walks the open streams ----------------------------------------------------------
def _count_flushes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original: Callable[..., Any] = Connection._flush  # type: ignore[attr-defined]

    def counting(self: Connection, stream: Any) -> None:
        calls.append(stream.id)
        original(self, stream)

    monkeypatch.setattr(Connection, "_flush", counting)
    return calls


def test_settings_revisit_only_the_streams_a_raised_initial_window_unblocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wire = Wire()
    wire.raw(f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 0}))
    for sid in (1, 3, 5):
        wire.raw(headers(sid) + data(sid, grpc_message(b"x")))
    wire.raw(headers(7) + headers(9))  # open, with nothing to send: no SETTINGS may visit them
    wire.transport.take()
    calls = _count_flushes(monkeypatch)
    wire.raw(f.settings_frame({f.SETTINGS_MAX_FRAME_SIZE: 16_384}))
    wire.raw(f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 0}))  # unchanged
    assert calls == []
    wire.raw(f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: 100}))
    assert sorted(calls) == [1, 3, 5]
    replies = [(sid, p) for kind, _, sid, p in frames_in(wire.transport.take()) if kind == f.DATA]
    assert sorted(replies) == [(sid, grpc_message(b"re:x")) for sid in (1, 3, 5)]


def test_a_connection_window_update_revisits_only_streams_the_connection_window_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wire = Wire(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10}, ack_data=False)
    held_by_stream = [wire.open(), wire.open()]
    for sid in held_by_stream:
        wire.send(sid, b"y" * 50)
    held_by_connection = wire.open()
    wire.client.increment_flow_control_window(1_000_000, stream_id=held_by_connection)
    wire.send(held_by_connection, b"z" * 100_000)
    wire.pump()
    assert len(wire.results[held_by_connection].data) == 65_535 - 20  # the connection window ran out
    calls = _count_flushes(monkeypatch)
    wire.client.increment_flow_control_window(1_000)
    wire.pump()
    assert calls == [held_by_connection]
