"""One HTTP/2 connection carrying gRPC bidirectional streams: frames in, messages to handlers, replies out.

An ``asyncio.Protocol``: bytes arrive in ``data_received`` and are parsed there, every frame of a
read in one pass, and everything the pass produces (replies, window updates, trailers) goes out in
one ``transport.write``. A stream's handler is a coroutine per message that normally completes
without suspending (the ext_proc handler suspends only to scan a big body in a child process), so it
is stepped by hand: no task, no queue, no thread per message. Only when it suspends does a task take
over that stream (owned by the connection, cancelled with it), and later messages of the stream wait
behind it in order.

What the peer must get right, else the connection ends with GOAWAY and the RFC 9113 error code:
the preface, frame sizes, stream ids and states, CONTINUATION sequences, HPACK, flow-control
windows. What a stream gets wrong ends only that stream: RST_STREAM, or a gRPC status in trailers (a
message over the size limit: RESOURCE_EXHAUSTED; a compressed message: UNIMPLEMENTED; an unknown
method: UNIMPLEMENTED; a handler's ``StreamError``: its status; any other exception: UNKNOWN, logged).

What bounds a peer's cost (``Limits``; GOAWAY ENHANCE_YOUR_CALM past a rate or cap):
- streams: SETTINGS_MAX_CONCURRENT_STREAMS is advertised, a stream past it is REFUSED_STREAM;
- memory: stream and connection windows are credited back only for bytes handed to a handler or
  dropped, so a connection never holds more than its window. A message being assembled reserves its
  declared length out of the connection's reservation budget, and its stream window is widened to
  fit it (the extra credit is not given back); a message that finds the budget spent waits, first
  come first served, within its stream window, and should waiting messages hold more than
  ``Limits.waiting_bytes`` the stream adding more ends RESOURCE_EXHAUSTED. Messages holding
  reservations always fit in the rest of the window: the connection never stalls;
- output: reading stops while the transport's write buffer is above its high-water mark, and control
  replies (PING and SETTINGS ACKs, RST_STREAM) queued behind a peer that does not read are capped;
- frame rates: SETTINGS, PING, RST_STREAM of a stream not answered yet (and refused streams), empty
  DATA and CONTINUATION;
- work per frame: no control frame walks the open streams (send windows are relative to the
  peer's initial window; only streams a WINDOW_UPDATE or SETTINGS unblocks are revisited);
- time (with a ``Clock``): the preface, a header block (or any non-DATA frame) left incomplete, an
  idle connection (no open stream), a peer that stops reading.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, Protocol, cast

from hpack import Decoder
from hpack.exceptions import HPACKError

from epp.h2 import frames as f
from epp.h2.flow import Inbound
from epp.h2.guard import CLOSED_BY_PEER, CLOSED_BY_US, ClosedStreams, Rate
from epp.h2.headers import Malformed, check_request, check_trailers
from epp.h2.limits import GOAWAY_GRACE
from epp.h2.limits import Limits as Limits
from epp.h2.streams import GRPC_PREFIX_BYTES as _GRPC_PREFIX_BYTES
from epp.h2.streams import INVALID_ARGUMENT, OK, RESOURCE_EXHAUSTED, UNIMPLEMENTED, UNKNOWN
from epp.h2.streams import GrpcStream as GrpcStream
from epp.h2.streams import Replies as Replies
from epp.h2.streams import Stream as _Stream
from epp.h2.streams import StreamError as StreamError
from epp.h2.streams import StreamFactory as StreamFactory
from epp.h2.streams import continue_coroutine as _continue

log = logging.getLogger(__name__)

_HEADER_CACHE_BLOCKS: Final = 16
_MAX_STREAM_ID: Final = 2**31 - 1


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Where a connection's timeouts run (the server passes its event loop's)."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...


class ConnectionError_(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY(code)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class Connection(asyncio.Protocol):
    """Server side of one connection; ``methods`` maps a ``:path`` to the factory of its streams."""

    def __init__(
        self,
        methods: dict[bytes, StreamFactory],
        limits: Limits,
        *,
        on_made: Callable[[Connection], int | None] | None = None,
        on_lost: Callable[[Connection], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``on_made`` may refuse the connection (an error code: GOAWAY with it, then closed);
        ``on_lost`` is told when it is gone. Without a ``clock`` no timeout is enforced."""
        self._methods = methods
        self._limits = limits
        self._on_made = on_made
        self._on_lost = on_lost
        self._clock = clock
        self._transport: asyncio.Transport | None = None
        self._inbuf = bytearray()
        self._preface_seen = False
        self._decoder = Decoder(max_header_list_size=limits.max_header_list_bytes)
        self._header_cache: dict[bytes, Sequence[tuple[bytes, bytes]]] = {}
        self._request_cache: dict[bytes, tuple[bytes, int | None]] = {}  # check_request of those
        self._streams: dict[int, _Stream] = {}
        self._closed_streams = ClosedStreams(limits.closed_streams_remembered)
        self._out: list[bytes] | None = None  # frames of the current pass, written once at its end
        self._header_block: bytearray | None = None  # HEADERS awaiting CONTINUATION
        self._header_stream = 0
        self._header_end_stream = False
        self._header_frames = 0
        self._last_stream = 0
        self._inflow = Inbound(limits.effective_connection_window)
        self._max_message = limits.max_message_bytes
        self._budget = limits.reservation_budget
        self._reserved = 0  # of the budget, by streams assembling a message
        self._waiting: dict[_Stream, None] = {}  # streams whose message waits for a reservation
        self._unreserved = 0  # bytes of incomplete messages without a reservation
        self._unreserved_limit = limits.waiting_bytes
        self._send_window = f.DEFAULT_WINDOW
        self._peer_initial_window = f.DEFAULT_WINDOW
        self._max_send_credit = 0  # at least every open stream's send_credit
        self._peer_max_frame = f.DEFAULT_MAX_FRAME
        self._conn_blocked: dict[_Stream, None] = {}  # DATA held by the connection window, in order
        self._window_blocked: set[_Stream] = set()  # DATA held by the stream's own window
        self._tasks: set[asyncio.Task[None]] = set()
        self._draining = False
        self._close_when_idle = False
        self._close_after_pass = False
        self._closed = False
        self._writing_paused = False
        self._control_queued = 0  # control replies written since the write buffer was last empty
        now = self._now()
        self._settings_rate = Rate(limits.settings_per_second, now)
        self._ping_rate = Rate(limits.pings_per_second, now)
        self._reset_rate = Rate(limits.resets_per_second, now)
        self._empty_rate = Rate(limits.empty_frames_per_second, now)
        self._idle_since = now
        self._preface_timer: Timer | None = None
        self._header_timer: Timer | None = None
        self._idle_timer: Timer | None = None
        self._stall_timer: Timer | None = None
        self._linger_timer: Timer | None = None
        self.idle = asyncio.Event()  # no open stream (the server's graceful stop waits for it)
        self.idle.set()
        self._lost = asyncio.Event()

    # --- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports implement the interface without the base class.
        transport = self._transport = cast(asyncio.Transport, transport)
        refusal = self._on_made(self) if self._on_made is not None else None
        if refusal is not None:
            self._closed = True
            why = b"the server is stopping" if refusal == f.NO_ERROR else b"too many connections"
            transport.write(f.settings_frame({}) + f.goaway(0, refusal, why))
            transport.close()
            return
        limits = self._limits
        transport.set_write_buffer_limits(high=limits.write_buffer_high)
        settings = {
            f.SETTINGS_ENABLE_PUSH: 0,
            f.SETTINGS_MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
            f.SETTINGS_INITIAL_WINDOW_SIZE: limits.stream_window,
            f.SETTINGS_MAX_FRAME_SIZE: limits.max_frame_bytes,
            f.SETTINGS_MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
        }
        out = f.settings_frame(settings)
        # The connection window starts at 65,535 whatever the settings say (RFC 9113 §6.9.2).
        size = self._inflow.size
        if size > f.DEFAULT_WINDOW:
            out += f.window_update(0, size - f.DEFAULT_WINDOW)
        transport.write(out)
        self._preface_timer = self._arm(limits.preface_timeout, self._preface_timed_out)
        self._idle_timer = self._arm(limits.idle_timeout, self._idle_check)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        transport = self._transport
        if self._control_queued and transport is not None and not transport.get_write_buffer_size():
            self._control_queued = 0  # the peer read everything: nothing is queued any more
        self._inbuf += data
        self._out = []
        try:
            self._parse()
        except ConnectionError_ as exc:
            self._fail(exc.code, str(exc))
        finally:
            self._flush_out()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def pause_writing(self) -> None:
        """The write buffer passed its high-water mark: read nothing more until it drains."""
        self._writing_paused = True
        if self._transport is not None and not self._closed:
            self._transport.pause_reading()
            if self._stall_timer is None:
                self._stall_timer = self._arm(self._limits.idle_timeout, self._stall_timed_out)

    def resume_writing(self) -> None:
        self._writing_paused = False
        _cancel(self._stall_timer)
        self._stall_timer = None
        if self._transport is not None and not self._closed:
            self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        timers = (
            self._preface_timer,
            self._header_timer,
            self._idle_timer,
            self._stall_timer,
            self._linger_timer,
        )
        for timer in timers:
            _cancel(timer)
        self._preface_timer = self._header_timer = self._idle_timer = self._stall_timer = None
        self._linger_timer = None
        for stream in list(self._streams.values()):
            self._drop(stream)
        self._streams.clear()
        self._conn_blocked.clear()
        self._window_blocked.clear()
        self.idle.set()
        self._lost.set()
        if self._on_lost is not None:
            self._on_lost(self)

    # --- what the server calls ---------------------------------------------------------------------
    def drain(self) -> None:
        """Graceful stop: GOAWAY (streams already open finish, new ones are refused)."""
        if self._closed or self._draining:
            return
        self._draining = True
        self._write(f.goaway(self._last_stream, f.NO_ERROR))

    def close(self) -> None:
        """Stop now: open streams are abandoned (their handlers closed)."""
        if self._transport is not None and not self._closed:
            self._transport.close()

    async def wait_closed(self) -> None:
        """Until the transport is gone and every suspended handler has returned."""
        await self._lost.wait()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # --- time --------------------------------------------------------------------------------------
    def _now(self) -> float:
        return self._clock.time() if self._clock is not None else time.monotonic()

    def _arm(self, delay: float, callback: Callable[[], None]) -> Timer | None:
        if self._clock is None or delay <= 0:
            return None
        return self._clock.call_later(delay, callback)

    def _preface_timed_out(self) -> None:
        self._preface_timer = None
        if not self._preface_seen:
            self._fail(f.ENHANCE_YOUR_CALM, f"no connection preface within {self._limits.preface_timeout}s")

    def _header_timed_out(self) -> None:
        self._header_timer = None
        self._fail(f.ENHANCE_YOUR_CALM, f"a frame left incomplete for {self._limits.header_timeout}s")

    def _stall_timed_out(self) -> None:
        self._stall_timer = None
        self._fail(f.ENHANCE_YOUR_CALM, f"the peer read nothing for {self._limits.idle_timeout}s")

    def _idle_check(self) -> None:
        """Every idle timeout: a connection without streams for that long is closed in two steps, a
        GOAWAY that admits streams already on their way, then one naming the last (RFC 9113 §6.8)."""
        self._idle_timer = None
        if self._closed or self._close_when_idle:
            return
        timeout = self._limits.idle_timeout
        if self._streams:
            self._idle_timer = self._arm(timeout, self._idle_check)
            return
        left = self._idle_since + timeout - self._now()
        if left > 0:
            self._idle_timer = self._arm(left, self._idle_check)
            return
        if not self._draining:
            self._write(f.goaway(_MAX_STREAM_ID, f.NO_ERROR, b"idle"))
        self._idle_timer = self._arm(GOAWAY_GRACE, self._idle_close)

    def _idle_close(self) -> None:
        self._idle_timer = None
        self.drain()
        self._close_when_idle = True
        self._check_idle()

    # --- output ------------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self._out is not None:
            self._out.append(data)
        elif self._transport is not None and not self._closed:
            self._transport.write(data)

    def _control(self, data: bytes) -> None:
        """A control reply; too many behind a peer that does not read end the connection."""
        self._control_queued += 1
        if self._control_queued > self._limits.max_queued_control_frames:
            raise ConnectionError_(
                f.ENHANCE_YOUR_CALM, "too many control replies queued to a peer that does not read"
            )
        self._write(data)

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out and self._transport is not None and not self._closed:
            self._transport.write(b"".join(out))
        if self._close_after_pass:
            self._close_after_pass = False
            self.close()

    def _fail(self, code: int, why: str) -> None:
        log.warning("closing an HTTP/2 connection: %s (error code %d)", why, code)
        if self._closed:
            return
        self._write(f.goaway(self._last_stream, code, why.encode("utf-8", "replace")[:256]))
        self._flush_out()
        self._closed = True
        for stream in list(self._streams.values()):
            self._drop(stream)
        self._streams.clear()
        transport = self._transport
        if transport is None:
            return
        if self._writing_paused:
            transport.abort()  # the peer reads nothing: do not wait for the buffer to drain
            return
        # Closed with the peer's bytes unread, the socket would be reset, and the GOAWAY still on
        # its way lost with it: what arrives is read (and dropped) for a moment first, as Go does.
        self._linger_timer = self._arm(GOAWAY_GRACE, transport.close)
        if self._linger_timer is None:
            transport.close()

    def _spend(self, rate: Rate, what: str) -> None:
        if not rate.spend(self._now()):
            raise ConnectionError_(f.ENHANCE_YOUR_CALM, f"{what} over the rate limit")

    # --- input -------------------------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self._inbuf
        if not self._preface_seen:
            if len(buf) < len(f.PREFACE):
                if not f.PREFACE.startswith(bytes(buf)):
                    raise ConnectionError_(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if bytes(buf[: len(f.PREFACE)]) != f.PREFACE:
                raise ConnectionError_(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            del buf[: len(f.PREFACE)]
            self._preface_seen = True
            _cancel(self._preface_timer)
            self._preface_timer = None
        view = memoryview(buf)
        position, end, limit = 0, len(buf), self._limits.max_frame_bytes
        try:
            while end - position >= f.FRAME_HEADER_BYTES and not self._closed:
                high, low, kind, flags, stream_id = f.FRAME_HEADER.unpack_from(buf, position)
                length = (high << 8) | low
                if length > limit:
                    raise ConnectionError_(f.FRAME_SIZE_ERROR, f"frame of {length} bytes over {limit}")
                start = position + f.FRAME_HEADER_BYTES
                if end - start < length:
                    break
                position = start + length
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, view[start:position])
        except BaseException:
            view.release()  # the buffer is not trimmed: the connection is closing
            raise
        view.release()
        del buf[:position]  # no slice of it outlives a frame's handling
        # A header block, or any frame but DATA, left incomplete must be finished in time.
        if self._header_block is not None or (buf and (len(buf) < 4 or buf[3] != f.DATA)):
            if self._header_timer is None:
                self._header_timer = self._arm(self._limits.header_timeout, self._header_timed_out)
        elif self._header_timer is not None:
            _cancel(self._header_timer)
            self._header_timer = None

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._header_block is not None and kind != f.CONTINUATION:
            raise ConnectionError_(f.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == f.DATA:
            self._on_data(stream_id, flags, payload)
        elif kind == f.HEADERS:
            self._on_headers(stream_id, flags, payload)
        elif kind == f.CONTINUATION:
            self._on_continuation(stream_id, flags, payload)
        elif kind == f.SETTINGS:
            self._on_settings(stream_id, flags, payload)
        elif kind == f.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == f.PING:
            if stream_id != 0:
                raise ConnectionError_(f.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ConnectionError_(f.FRAME_SIZE_ERROR, "PING of the wrong size")
            self._spend(self._ping_rate, "PING")
            if not flags & f.ACK:
                self._control(f.frame(f.PING, f.ACK, 0, bytes(payload)))
        elif kind == f.RST_STREAM:
            self._on_rst_stream(stream_id, payload)
        elif kind == f.PRIORITY:
            self._on_priority(stream_id, payload)
        elif kind == f.GOAWAY:
            if stream_id != 0:
                raise ConnectionError_(f.PROTOCOL_ERROR, "GOAWAY on a stream")
        elif kind == f.PUSH_PROMISE:
            raise ConnectionError_(f.PROTOCOL_ERROR, "a client cannot push")
        # Unknown frame types are ignored (RFC 9113 §5.5).

    def _not_open(self, stream_id: int, what: str) -> None:
        """A frame for a stream that is not open: an error if the stream is idle or the peer closed
        it; else (we closed it, or it is forgotten) the frame may have been in flight: ignored."""
        if stream_id > self._last_stream:
            raise ConnectionError_(f.PROTOCOL_ERROR, f"{what} on idle stream {stream_id}")
        if self._closed_streams.get(stream_id) is CLOSED_BY_PEER:
            raise ConnectionError_(f.STREAM_CLOSED, f"{what} on closed stream {stream_id}")

    def _on_rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            if stream_id > self._last_stream:
                raise ConnectionError_(f.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
            return  # a stream we finished: its work is done, a reset undoes nothing
        if not stream.headers_sent:
            # Only a stream abandoned before any answer counts against the rate: that is a rapid
            # reset (CVE-2023-44487), work started and thrown away. Envoy itself resets ext_proc
            # streams it has had its answers on, once per request: counting those closed Envoy's
            # connection past 1,000 requests a second (in-flight requests failed, then a new
            # connection and TLS handshake).
            self._spend(self._reset_rate, "RST_STREAM")
        self._closed_streams.add(stream_id, CLOSED_BY_PEER)
        self._drop(stream)
        self._check_idle()

    def _on_priority(self, stream_id: int, payload: memoryview) -> None:
        """Priorities are not used, only checked (RFC 9113 §6.3)."""
        if stream_id == 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != f.PRIORITY_BYTES:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "PRIORITY of the wrong size")
        if f.U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
            raise ConnectionError_(f.PROTOCOL_ERROR, f"stream {stream_id} depends on itself")

    def _on_settings(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ConnectionError_(f.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "SETTINGS payload not a multiple of 6")
        self._spend(self._settings_rate, "SETTINGS")
        raised = False
        for offset in range(0, len(payload), 6):
            key, value = f.SETTING.unpack_from(payload, offset)
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                raised = self._peer_initial_window_is(value) or raised
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise ConnectionError_(f.PROTOCOL_ERROR, f"max frame size {value} out of range")
                self._peer_max_frame = value
            elif key == f.SETTINGS_ENABLE_PUSH and value > 1:
                raise ConnectionError_(f.PROTOCOL_ERROR, f"ENABLE_PUSH of {value}")
            # The others bind the peer (its decoder's table: we never index) or are advisory.
        self._control(f.frame(f.SETTINGS, f.ACK, 0))
        if raised:  # only streams held by their own window can move, and each one that is does
            for stream in list(self._window_blocked):
                self._flush(stream)

    def _peer_initial_window_is(self, value: int) -> bool:
        """Apply a new SETTINGS_INITIAL_WINDOW_SIZE; True when it grew."""
        if value > f.MAX_WINDOW:
            raise ConnectionError_(f.FLOW_CONTROL_ERROR, "initial window over 2^31-1")
        old = self._peer_initial_window
        if value > old and value + self._max_send_credit > f.MAX_WINDOW:
            # The bound may be stale (streams sent data or closed since): recompute it, once.
            self._max_send_credit = max((s.send_credit for s in self._streams.values()), default=0)
            if value + self._max_send_credit > f.MAX_WINDOW:
                raise ConnectionError_(f.FLOW_CONTROL_ERROR, "the new initial window overflows a stream's")
        self._peer_initial_window = value
        return value > old

    def _on_window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = f.U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise ConnectionError_(f.FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            self._flush_conn_blocked()
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream:
                raise ConnectionError_(f.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
            return  # closed already: frames in flight are expected
        credit = stream.send_credit + increment
        if increment == 0 or self._peer_initial_window + credit > f.MAX_WINDOW:
            self._reset(stream, f.PROTOCOL_ERROR if increment == 0 else f.FLOW_CONTROL_ERROR)
            return
        stream.send_credit = credit
        if credit > self._max_send_credit:
            self._max_send_credit = credit
        self._flush(stream)

    # --- headers -----------------------------------------------------------------------------------
    def _on_headers(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        if flags & f.PADDED:
            payload = _unpad(payload)
        if flags & f.PRIORITY_FLAG:
            if len(payload) < f.PRIORITY_BYTES:
                raise ConnectionError_(f.PROTOCOL_ERROR, "HEADERS too short for its priority")
            if f.U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
                raise ConnectionError_(f.PROTOCOL_ERROR, f"stream {stream_id} depends on itself")
            payload = payload[f.PRIORITY_BYTES :]
        self._header_block = bytearray(payload)
        self._header_stream = stream_id
        self._header_end_stream = bool(flags & f.END_STREAM)
        self._header_frames = 0  # CONTINUATION frames so far
        if flags & f.END_HEADERS:
            self._headers_complete()

    def _on_continuation(self, stream_id: int, flags: int, payload: memoryview) -> None:
        block = self._header_block
        if block is None or stream_id != self._header_stream:
            raise ConnectionError_(f.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._header_frames += 1
        if self._header_frames > self._limits.max_continuation_frames:
            raise ConnectionError_(f.ENHANCE_YOUR_CALM, "too many CONTINUATION frames in a header block")
        end_headers = flags & f.END_HEADERS
        if not payload and not end_headers:
            self._spend(self._empty_rate, "empty frames")
        block += payload
        if len(block) > 2 * self._limits.max_header_list_bytes:
            raise ConnectionError_(f.PROTOCOL_ERROR, "header block too large")
        if end_headers:
            self._headers_complete()

    def _headers_complete(self) -> None:
        block, self._header_block = bytes(self._header_block or b""), None
        stream_id, end_stream = self._header_stream, self._header_end_stream
        headers = self._decode(block)
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client: only END_STREAM matters
            if stream.remote_closed:
                self._reset(stream, f.STREAM_CLOSED)
            elif not end_stream:
                self._reset(stream, f.PROTOCOL_ERROR)
            else:
                try:
                    check_trailers(headers)
                except Malformed:
                    self._reset(stream, f.PROTOCOL_ERROR)
                    return
                self._remote_end(stream)
            return
        if stream_id <= self._last_stream:  # decoded all the same: the HPACK table stays in step
            closed = self._closed_streams.get(stream_id)
            if closed is CLOSED_BY_US:
                return  # trailers it sent before it heard of the reset
            if closed is CLOSED_BY_PEER:
                raise ConnectionError_(f.STREAM_CLOSED, f"HEADERS on closed stream {stream_id}")
            raise ConnectionError_(f.PROTOCOL_ERROR, f"stream {stream_id} opened after {self._last_stream}")
        self._last_stream = stream_id
        if self._draining:
            self._refuse(stream_id)
            return
        if len(self._streams) >= self._limits.max_concurrent_streams:
            self._spend(self._reset_rate, "refused streams")
            self._refuse(stream_id)
            return
        request = self._request_cache.get(block)
        if request is None:
            try:
                request = check_request(headers)
            except Malformed:
                self._control(f.rst_stream(stream_id, f.PROTOCOL_ERROR))
                self._closed_streams.add(stream_id, CLOSED_BY_US)
                return
            if block in self._header_cache:  # Envoy's blocks repeat: checked once per table state
                self._request_cache[block] = request
        path, content_length = request
        factory = self._methods.get(path)
        if factory is None:
            message = f"unknown method {path.decode('latin-1')!r}"
            block = f.RESPONSE_HEADERS + f.trailers(UNIMPLEMENTED, message)
            self._write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, block))
            if not end_stream:
                self._control(f.rst_stream(stream_id, f.NO_ERROR))
            self._closed_streams.add(stream_id, CLOSED_BY_PEER if end_stream else CLOSED_BY_US)
            return
        stream = _Stream(stream_id, factory(), self._limits.stream_window)
        stream.content_left = content_length
        self._streams[stream_id] = stream
        self.idle.clear()
        if end_stream:
            self._remote_end(stream)

    def _refuse(self, stream_id: int) -> None:
        self._control(f.rst_stream(stream_id, f.REFUSED_STREAM))
        self._closed_streams.add(stream_id, CLOSED_BY_US)

    def _decode(self, block: bytes) -> Sequence[tuple[bytes, bytes]]:
        """HPACK-decode ``block``, remembering blocks that leave the dynamic table as it was.

        Envoy opens every ext_proc stream with the same block (``:path`` and ``:authority`` as literals
        it never indexes, the rest as references to its table), so decoding it once per table state
        saves the Huffman decoding of every stream. A block that changes the table clears the cache.
        """
        cached = self._header_cache.get(block)
        if cached is not None:
            return cached
        table = self._decoder.header_table
        before = (table.maxsize, tuple(table.dynamic_entries))
        try:
            headers = tuple(self._decoder.decode(block, raw=True))
        except HPACKError as exc:  # the decoder's table may be out of step: the connection is lost
            # The class only: the library's text can hold a repr with an address, sent to the peer.
            raise ConnectionError_(
                f.COMPRESSION_ERROR, f"undecodable header block ({type(exc).__name__})"
            ) from None
        if (table.maxsize, tuple(table.dynamic_entries)) != before:
            self._header_cache.clear()
            self._request_cache.clear()
        elif len(self._header_cache) < _HEADER_CACHE_BLOCKS:
            self._header_cache[block] = headers
        return headers

    # --- data --------------------------------------------------------------------------------------
    def _on_data(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        inflow = self._inflow
        inflow.available -= size  # received: what the peer may still send (the hot path, inline)
        if inflow.available < 0:
            raise ConnectionError_(f.FLOW_CONTROL_ERROR, "the peer overran the connection window")
        if flags & f.PADDED:
            payload = _unpad(payload)
        end_stream = flags & f.END_STREAM
        if not payload and not end_stream:
            self._spend(self._empty_rate, "empty frames")
        stream = self._streams.get(stream_id)
        if stream is None:
            self._not_open(stream_id, "DATA")
            self._consumed(size)
            return
        if stream.remote_closed:
            self._consumed(size)
            self._reset(stream, f.STREAM_CLOSED)
            return
        recv = stream.recv
        recv.available -= size
        if recv.available < 0:
            self._consumed(size)
            self._reset(stream, f.FLOW_CONTROL_ERROR)
            return
        data_bytes = len(payload)
        if stream.content_left is not None:
            stream.content_left -= data_bytes
            if stream.content_left < 0:
                self._consumed(size)
                self._reset(stream, f.PROTOCOL_ERROR)  # DATA and content-length disagree (§8.1.1)
                return
        if size > data_bytes:
            self._consumed(size - data_bytes)  # padding
        held = stream.held
        if stream.finished:  # the status is decided: the rest of the request is dropped
            self._consumed(data_bytes)
        elif (
            not stream.buffer
            and stream.task is None
            and data_bytes >= _GRPC_PREFIX_BYTES
            and not payload[0]
            and int.from_bytes(payload[1:5], "big") == data_bytes - _GRPC_PREFIX_BYTES
            and data_bytes - _GRPC_PREFIX_BYTES <= self._max_message
        ):
            # The usual frame (Envoy's): one whole message, handed over at once; _messages' work, inline.
            self._message(stream, bytes(payload[_GRPC_PREFIX_BYTES:]))
            inflow.owed += data_bytes  # self._consumed(data_bytes), inline
            if inflow.available < inflow.size >> 1:
                increment, inflow.owed = inflow.owed, 0
                inflow.available += increment
                self._write(f.window_update(0, increment))
        else:
            stream.held = held + data_bytes
            self._messages(stream, payload)
            if stream.counted and self._unreserved > self._unreserved_limit and not stream.finished:
                message = "too many incomplete messages wait for the connection's flow-control window"
                self._finish(stream, RESOURCE_EXHAUSTED, message)
        if end_stream:
            self._remote_end(stream)
        elif stream.id in self._streams and not stream.finished:
            # Stream credit for what the stream no longer holds: the padding and the messages handed
            # over (all of this frame, usually); what a partial or queued message holds comes back later.
            credit = size + held - stream.held
            if not credit:
                pass
            elif stream.lent:
                self._stream_consumed(stream, credit)
            else:  # _stream_consumed, inline: this is the hot path
                recv.owed += credit
                if recv.available < recv.size >> 1:
                    increment, recv.owed = recv.owed, 0
                    recv.available += increment
                    self._write(f.window_update(stream.id, increment))

    def _consumed(self, n: int) -> None:
        increment = self._inflow.consume(n)
        if increment:
            self._write(f.window_update(0, increment))

    def _stream_consumed(self, stream: _Stream, n: int) -> None:
        """``n`` bytes the stream held are gone: credit for them, less what was lent past its window
        for a message (repaid once it is complete: until then the padding of its frames is credited)."""
        lent = stream.lent
        if lent and not stream.reserved:
            if n <= lent:
                stream.lent = lent - n
                return
            stream.lent = 0
            n -= lent
        recv = stream.recv
        recv.owed += n  # Inbound.consume, inline
        if recv.owed and recv.available < recv.size >> 1:
            increment, recv.owed = recv.owed, 0
            recv.available += increment
            self._write(f.window_update(stream.id, increment))

    # --- reservations for messages being assembled -------------------------------------------------
    def _assembling(self, stream: _Stream) -> None:
        """After a DATA frame left ``stream.buffer`` non-empty: reserve the message's declared length
        (or wait for it), and count what waits."""
        buffer = stream.buffer
        # Once the length is known (and was checked): reserve it, or wait in line.
        if not stream.reserved and len(buffer) >= _GRPC_PREFIX_BYTES and stream not in self._waiting:
            total = _GRPC_PREFIX_BYTES + int.from_bytes(buffer[1:5], "big")
            if not self._reserved or self._reserved + total <= self._budget:
                self._reserve(stream, total)
                return
            self._waiting[stream] = None
        if not stream.reserved:
            self._unreserved += len(buffer) - stream.counted
            stream.counted = len(buffer)

    def _reserve(self, stream: _Stream, total: int) -> None:
        """Reserve ``total`` bytes for the message in the stream's buffer and widen its window to fit."""
        stream.reserved = total
        self._reserved += total
        self._unreserved -= stream.counted
        stream.counted = 0
        recv = stream.recv
        missing = total - len(stream.buffer) - recv.available
        if missing > 0 and stream.id in self._streams and not stream.remote_closed:
            recv.available += missing
            stream.lent += missing
            self._write(f.window_update(stream.id, missing))

    def _assembled(self, stream: _Stream) -> None:
        """The stream's message is complete or dropped: its reservation (or place in line) is free."""
        if stream.counted:
            self._unreserved -= stream.counted
            stream.counted = 0
        if stream.reserved:
            self._reserved -= stream.reserved
            stream.reserved = 0
            waiting = self._waiting
            while waiting:  # first come, first served
                first = next(iter(waiting))
                total = _GRPC_PREFIX_BYTES + int.from_bytes(first.buffer[1:5], "big")
                if self._reserved and self._reserved + total > self._budget:
                    break
                del waiting[first]
                self._reserve(first, total)
        elif self._waiting:
            self._waiting.pop(stream, None)

    def _messages(self, stream: _Stream, payload: memoryview) -> None:
        """Cut gRPC messages (1-byte flag, 4-byte length, bytes) out of a stream's DATA."""
        buffer = stream.buffer
        if buffer:
            buffer += payload
            data: bytes | bytearray | memoryview = buffer
        else:
            data = payload  # the usual case: whole messages in one frame, no copy into a buffer
        position, end, limit = 0, len(data), self._limits.max_message_bytes
        handed = 0  # bytes of messages handed over: credit given back once, at the end
        while end - position >= _GRPC_PREFIX_BYTES:
            compressed = data[position]
            length = int.from_bytes(data[position + 1 : position + 5], "big")
            if compressed:
                self._finish(stream, UNIMPLEMENTED, "compressed messages are not supported")
                break
            if length > limit:
                message = f"grpc: received message larger than max ({length} vs. {limit})"
                self._finish(stream, RESOURCE_EXHAUSTED, message)
                break
            start = position + _GRPC_PREFIX_BYTES
            if end - start < length:
                break
            position = start + length
            if stream.reserved or stream.counted or self._waiting:
                self._assembled(stream)
            message_bytes = bytes(data[start:position])
            if stream.task is None:
                stream.held -= _GRPC_PREFIX_BYTES + length
                handed += _GRPC_PREFIX_BYTES + length
            self._message(stream, message_bytes)
            if stream.finished:
                break
        if not stream.finished:  # (finished: its buffer is dropped already)
            if data is buffer:
                del buffer[:position]
            elif position < end:
                buffer += data[position:]
            if buffer:
                self._assembling(stream)
        if handed:  # self._consumed(handed), inline: this is the hot path
            inflow = self._inflow
            inflow.owed += handed
            if inflow.available < inflow.size >> 1:
                increment, inflow.owed = inflow.owed, 0
                inflow.available += increment
                self._write(f.window_update(0, increment))

    # --- running handlers --------------------------------------------------------------------------
    def _message(self, stream: _Stream, message: bytes) -> None:
        if stream.task is not None:
            stream.queue.append(message)  # still held: its bytes are given back when it is handled
            return
        coro = stream.handler.handle(message)
        try:
            pending = coro.send(None)
        except StopIteration as done:
            self._reply(stream, done.value)
            return
        except BaseException as exc:
            self._handler_failed(stream, exc)
            return
        # A future yielded by an ``await`` stays marked "blocking" until a task takes it; until this
        # one's task runs, another stream awaiting the same future would fail ("await wasn't used
        # with future"). Unmarked here, marked again when the task takes it (``continue_coroutine``).
        blocking = getattr(pending, "_asyncio_future_blocking", False)
        if blocking:
            pending._asyncio_future_blocking = False
        task = asyncio.get_running_loop().create_task(self._run_suspended(stream, coro, pending, blocking))
        stream.task = task
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._suspended_done, stream, coro))

    async def _run_suspended(
        self, stream: _Stream, coro: Coroutine[Any, Any, Any], pending: Any, blocking: bool
    ) -> None:
        try:
            result = await _continue(coro, pending, blocking)
        except asyncio.CancelledError:
            raise  # `_suspended_done` cleans up
        except BaseException as exc:
            stream.task = None
            self._out = []
            self._handler_failed(stream, exc)
        else:
            stream.task = None
            self._out = []
            self._reply(stream, result)
        try:
            if stream.close_after_task:
                self._release(stream)
            credit = 0
            while stream.queue and stream.task is None and not stream.finished:
                message = stream.queue.popleft()
                stream.held -= _GRPC_PREFIX_BYTES + len(message)
                credit += _GRPC_PREFIX_BYTES + len(message)
                self._consumed(_GRPC_PREFIX_BYTES + len(message))
                self._message(stream, message)
            if stream.remote_closed and stream.task is None and not stream.finished:
                self._finish(stream, OK, "")
            if credit and not stream.finished and stream.id in self._streams and not stream.remote_closed:
                self._stream_consumed(stream, credit)
        finally:
            self._flush_out()

    def _suspended_done(
        self, stream: _Stream, coro: Coroutine[Any, Any, Any], task: asyncio.Task[None]
    ) -> None:
        """After a suspended handle: when it was cancelled (the stream or connection went away),
        possibly before the task ever ran, the handler's coroutine is unwound here and closed."""
        self._tasks.discard(task)
        if stream.task is task:
            stream.task = None
        if not task.cancelled():
            return
        if getattr(coro, "cr_frame", True) is None:  # it ran to its end in the task (cancelled there)
            self._release(stream)
            return
        try:
            coro.throw(asyncio.CancelledError())
        except (asyncio.CancelledError, StopIteration):
            pass
        except Exception as exc:
            log.error("a cancelled gRPC stream handler failed:\n%s", "".join(traceback.format_exception(exc)))
        finally:
            coro.close()
        self._release(stream)

    def _handler_failed(self, stream: _Stream, exc: BaseException) -> None:
        if isinstance(exc, StreamError):
            self._finish(stream, exc.status, exc.message)
            return
        if not isinstance(exc, Exception):
            raise exc
        # The traceback as text: a record holding exc_info would keep the frames alive.
        log.error("a gRPC stream handler failed:\n%s", "".join(traceback.format_exception(exc)))
        self._finish(stream, UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")

    def _reply(self, stream: _Stream, result: tuple[Replies, bool]) -> None:
        if stream.finished:
            return
        replies, end = result
        if replies is not None:
            if not stream.headers_sent:
                stream.headers_sent = True
                self._write(f.frame(f.HEADERS, f.END_HEADERS, stream.id, f.RESPONSE_HEADERS))
            pending = stream.pending
            for reply in (replies,) if isinstance(replies, bytes) else replies:
                pending.append(memoryview(len(reply).to_bytes(_GRPC_PREFIX_BYTES, "big") + reply))
            self._flush(stream)
        if end:
            self._finish(stream, OK, "")

    # --- ending streams ----------------------------------------------------------------------------
    def _remote_end(self, stream: _Stream) -> None:
        if stream.content_left:  # fewer DATA bytes than its content-length declared (§8.1.1)
            self._reset(stream, f.PROTOCOL_ERROR)
            return
        stream.remote_closed = True
        if stream.buffer and not stream.finished:
            self._finish(stream, INVALID_ARGUMENT, "the stream ended inside a message")
            return
        if stream.task is None and not stream.finished:
            self._finish(stream, OK, "")
        elif stream.finished and stream.trailers is None:
            self._forget(stream, CLOSED_BY_PEER)

    def _finish(self, stream: _Stream, status: int, message: str) -> None:
        """Decide the stream's status; trailers go out after any DATA still held by a window."""
        if stream.finished:
            return
        stream.finished = True
        if stream.held or stream.queue:
            self._release_held(stream)
        block = f.OK_TRAILERS if status == OK and not message else f.trailers(status, message)
        if not stream.headers_sent:
            stream.headers_sent = True
            block = f.RESPONSE_HEADERS + block  # trailers-only response
        stream.trailers = block
        self._flush(stream)
        self._release(stream)

    def _release_held(self, stream: _Stream) -> None:
        """Drop what the stream still holds of the peer's DATA, giving its credit back."""
        stream.queue.clear()
        stream.buffer.clear()
        if stream.reserved or stream.counted or self._waiting:
            self._assembled(stream)
        held, stream.held = stream.held, 0
        if held:
            self._consumed(held)

    def _send_trailers(self, stream: _Stream) -> None:
        block, stream.trailers = stream.trailers, None
        assert block is not None
        self._write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream.id, block))
        if not stream.remote_closed:
            # The peer may still be sending; tell it to stop (as gRPC servers do).
            self._write(f.rst_stream(stream.id, f.NO_ERROR))
            self._forget(stream, CLOSED_BY_US)
        else:
            self._forget(stream, CLOSED_BY_PEER)

    def _forget(self, stream: _Stream, by_peer: bool) -> None:
        if self._streams.pop(stream.id, None) is not None:
            self._closed_streams.add(stream.id, by_peer)
            if self._conn_blocked or self._window_blocked:
                self._unblock(stream)
            self._check_idle()

    def _reset(self, stream: _Stream, code: int) -> None:
        self._control(f.rst_stream(stream.id, code))
        self._streams.pop(stream.id, None)
        self._closed_streams.add(stream.id, CLOSED_BY_US)
        self._drop(stream)
        self._check_idle()

    def _drop(self, stream: _Stream) -> None:
        """The stream is gone (reset, connection lost): nothing more is sent; the handler is closed."""
        stream.finished = True
        self._release_held(stream)
        stream.pending.clear()
        stream.trailers = None
        self._unblock(stream)
        if stream.task is not None:
            stream.task.cancel()
        self._release(stream)

    def _release(self, stream: _Stream) -> None:
        """``handler.close()`` once, and never while one of its ``handle`` calls is suspended."""
        if stream.handler_closed:
            return
        if stream.task is not None:
            stream.close_after_task = True
            return
        stream.handler_closed = True
        try:
            stream.handler.close()
        except Exception as exc:
            log.error("closing a gRPC stream failed:\n%s", "".join(traceback.format_exception(exc)))

    def _check_idle(self) -> None:
        if self._streams:
            return
        self.idle.set()
        if self._close_when_idle:
            if self._out is None:
                self.close()
            else:
                self._close_after_pass = True  # after what this pass wrote
        elif self._idle_timer is not None:
            self._idle_since = self._now()

    # --- flow control on the way out ---------------------------------------------------------------
    def _flush(self, stream: _Stream) -> None:
        """Send what the windows allow of ``stream``'s DATA, then its trailers once nothing is held."""
        pending = stream.pending
        while pending:
            stream_window = self._peer_initial_window + stream.send_credit
            allowed = min(stream_window, self._send_window, self._peer_max_frame)
            if allowed <= 0:
                if stream_window <= 0:
                    self._conn_blocked.pop(stream, None)
                    self._window_blocked.add(stream)
                else:
                    self._window_blocked.discard(stream)
                    self._conn_blocked[stream] = None
                return
            chunk = pending[0]
            if len(chunk) <= allowed:
                pending.popleft()
            else:
                pending[0], chunk = chunk[allowed:], chunk[:allowed]
            size = len(chunk)
            stream.send_credit -= size
            self._send_window -= size
            self._write(f.frame(f.DATA, 0, stream.id, bytes(chunk)))
        if self._conn_blocked or self._window_blocked:
            self._unblock(stream)
        if stream.trailers is not None:
            self._send_trailers(stream)

    def _unblock(self, stream: _Stream) -> None:
        self._conn_blocked.pop(stream, None)
        self._window_blocked.discard(stream)

    def _flush_conn_blocked(self) -> None:
        """The connection window grew: streams held by it go on in the order they were held."""
        blocked = self._conn_blocked
        while blocked and self._send_window > 0:
            stream = next(iter(blocked))
            del blocked[stream]
            self._flush(stream)


def _cancel(timer: Timer | None) -> None:
    if timer is not None:
        timer.cancel()


def _unpad(payload: memoryview) -> memoryview:
    if not payload:
        raise ConnectionError_(f.PROTOCOL_ERROR, "padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionError_(f.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
