"""One HTTP/2 connection carrying gRPC bidirectional streams: frames in, messages to handlers, replies out.

An ``asyncio.Protocol``: bytes arrive in ``data_received`` and are parsed there, every frame of a
read in one pass, and everything the pass produces (replies, window updates, trailers) goes out in
one ``transport.write``. A stream's handler is a coroutine per message that normally completes
without suspending (the ext_proc handler suspends only to scan a big body in a child process), so it
is stepped by hand: no task, no queue, no thread per message. Only when it suspends does a task take
over that stream (owned by the connection, cancelled with it), and later messages of the stream wait
behind it in order.

What the peer must get right, else the connection ends with GOAWAY and the RFC 9113 error code:
the preface, frame sizes, stream ids, CONTINUATION sequences, HPACK, flow-control windows. What a
stream gets wrong ends only that stream: RST_STREAM, or a gRPC status in trailers (a message over
the size limit: RESOURCE_EXHAUSTED; a compressed message: UNIMPLEMENTED; an unknown method:
UNIMPLEMENTED; a handler's ``StreamError``: its status; any other exception: UNKNOWN, logged).
Flow control is honoured both ways: the peer's windows bound what is sent (the rest waits for its
WINDOW_UPDATE), and the windows granted to the peer are topped up as data is consumed.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import traceback
import types
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

from hpack import Decoder
from hpack.exceptions import HPACKError

from epp.h2 import frames as f

log = logging.getLogger(__name__)

# gRPC status codes used here.
OK: Final = 0
UNKNOWN: Final = 2
INVALID_ARGUMENT: Final = 3
RESOURCE_EXHAUSTED: Final = 8
UNIMPLEMENTED: Final = 12

_GRPC_PREFIX_BYTES: Final = 5
_HEADER_CACHE_BLOCKS: Final = 16


class StreamError(Exception):
    """Raised by a stream handler to end its stream with a gRPC status other than OK."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Replies = bytes | tuple[bytes, ...] | None
"""What a handler answers one message with: nothing, one message, or several in order."""


class GrpcStream(Protocol):
    """One RPC: ``handle`` each request message in order, ``close`` exactly once when it ends.

    ``handle`` returns (replies, end): ``end`` finishes the RPC with OK after the replies. Its first
    step runs outside any task (see the module docstring): code before its first suspension must
    not need ``asyncio.current_task()`` (``asyncio.timeout`` does).
    """

    async def handle(self, message: bytes) -> tuple[Replies, bool]: ...

    def close(self) -> None: ...


StreamFactory = Callable[[], GrpcStream]


@dataclass(frozen=True, slots=True)
class Limits:
    """What the server grants and accepts. Windows are topped up when half used."""

    max_message_bytes: int = 4 * 1024 * 1024
    stream_window: int = f.MAX_WINDOW
    connection_window: int = f.MAX_WINDOW
    max_frame_bytes: int = 1024 * 1024
    max_header_list_bytes: int = 64 * 1024


class ConnectionError_(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY(code)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class _Stream:
    __slots__ = (
        "buffer",
        "close_after_task",
        "finished",
        "handler",
        "handler_closed",
        "headers_sent",
        "id",
        "pending",
        "queue",
        "recv_window",
        "remote_closed",
        "send_window",
        "task",
        "trailers",
    )

    def __init__(self, stream_id: int, handler: GrpcStream, recv_window: int, send_window: int) -> None:
        self.id = stream_id
        self.handler = handler
        self.buffer = bytearray()  # a partial gRPC message
        self.recv_window = recv_window
        self.send_window = send_window
        self.pending: collections.deque[memoryview] = collections.deque()  # DATA held by flow control
        self.trailers: bytes | None = None  # held behind `pending`
        self.queue: collections.deque[bytes] = collections.deque()  # messages behind a suspended handle
        self.task: asyncio.Task[None] | None = None
        self.headers_sent = False
        self.remote_closed = False  # the peer sent END_STREAM
        self.finished = False  # our trailers are decided (sent or held)
        self.handler_closed = False
        self.close_after_task = False  # released while a handle() was suspended


@types.coroutine
def _continue(coro: Coroutine[Any, Any, Any], pending: Any) -> Generator[Any, Any, Any]:
    """Run the rest of a coroutine that was stepped by hand and suspended on ``pending``."""
    while True:
        try:
            sent = yield pending
        except BaseException as exc:  # cancellation and errors of what it awaits go to it
            try:
                pending = coro.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                pending = coro.send(sent)
            except StopIteration as done:
                return done.value


class Connection(asyncio.Protocol):
    """Server side of one connection; ``methods`` maps a ``:path`` to the factory of its streams."""

    def __init__(
        self,
        methods: dict[bytes, StreamFactory],
        limits: Limits,
        *,
        on_made: Callable[[Connection], bool] | None = None,
        on_lost: Callable[[Connection], None] | None = None,
    ) -> None:
        """``on_made`` may refuse the connection (False: it is closed at once); ``on_lost`` is told
        when it is gone."""
        self._methods = methods
        self._limits = limits
        self._on_made = on_made
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._inbuf = bytearray()
        self._preface_seen = False
        self._decoder = Decoder(max_header_list_size=limits.max_header_list_bytes)
        self._header_cache: dict[bytes, Sequence[tuple[bytes, bytes]]] = {}
        self._streams: dict[int, _Stream] = {}
        self._out: list[bytes] | None = None  # frames of the current pass, written once at its end
        self._header_block: bytearray | None = None  # HEADERS awaiting CONTINUATION
        self._header_stream = 0
        self._header_end_stream = False
        self._last_stream = 0
        self._recv_window = f.DEFAULT_WINDOW
        self._send_window = f.DEFAULT_WINDOW
        self._peer_initial_window = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_MAX_FRAME
        self._blocked: set[_Stream] = set()  # streams with DATA held by a window
        self._tasks: set[asyncio.Task[None]] = set()
        self._draining = False
        self._closed = False
        self.idle = asyncio.Event()  # no open stream (the server's graceful stop waits for it)
        self.idle.set()
        self._lost = asyncio.Event()

    # --- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports implement the interface without the base class.
        transport = self._transport = cast(asyncio.Transport, transport)
        if self._on_made is not None and not self._on_made(self):
            self._closed = True
            transport.close()
            return
        limits = self._limits
        settings = {
            f.SETTINGS_ENABLE_PUSH: 0,
            f.SETTINGS_INITIAL_WINDOW_SIZE: limits.stream_window,
            f.SETTINGS_MAX_FRAME_SIZE: limits.max_frame_bytes,
            f.SETTINGS_MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
        }
        out = f.settings_frame(settings)
        if limits.connection_window > f.DEFAULT_WINDOW:
            out += f.window_update(0, limits.connection_window - f.DEFAULT_WINDOW)
            self._recv_window = limits.connection_window
        transport.write(out)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
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

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        for stream in list(self._streams.values()):
            self._drop(stream)
        self._streams.clear()
        self._blocked.clear()
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

    # --- output ------------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self._out is not None:
            self._out.append(data)
        elif self._transport is not None and not self._closed:
            self._transport.write(data)

    def _flush_out(self) -> None:
        out, self._out = self._out, None
        if out and self._transport is not None and not self._closed:
            self._transport.write(b"".join(out))

    def _fail(self, code: int, why: str) -> None:
        log.warning("closing an HTTP/2 connection: %s (error code %d)", why, code)
        self._write(f.goaway(self._last_stream, code, why.encode("utf-8", "replace")[:256]))
        self._flush_out()
        self._closed = True
        if self._transport is not None:
            self._transport.close()

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
            if stream_id != 0 or len(payload) != 8:
                raise ConnectionError_(f.PROTOCOL_ERROR, "malformed PING")
            if not flags & f.ACK:
                self._write(f.frame(f.PING, f.ACK, 0, bytes(payload)))
        elif kind == f.RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise ConnectionError_(f.PROTOCOL_ERROR, "malformed RST_STREAM")
            stream = self._streams.pop(stream_id, None)
            if stream is not None:
                self._drop(stream)
                self._check_idle()
        elif kind == f.GOAWAY:
            if stream_id != 0:
                raise ConnectionError_(f.PROTOCOL_ERROR, "GOAWAY on a stream")
        elif kind == f.PUSH_PROMISE:
            raise ConnectionError_(f.PROTOCOL_ERROR, "a client cannot push")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5, §5.3.2).

    def _on_settings(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id != 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ConnectionError_(f.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "SETTINGS payload not a multiple of 6")
        for offset in range(0, len(payload), 6):
            key, value = f.SETTING.unpack_from(payload, offset)
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ConnectionError_(f.FLOW_CONTROL_ERROR, "initial window over 2^31-1")
                delta, self._peer_initial_window = value - self._peer_initial_window, value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise ConnectionError_(f.PROTOCOL_ERROR, f"max frame size {value} out of range")
                self._peer_max_frame = value
            # The others bind the peer (push, its decoder's table: we never index) or are advisory.
        self._write(f.frame(f.SETTINGS, f.ACK, 0))
        self._flush_blocked()

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
            self._flush_blocked()
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # closed already: frames in flight are expected
        if increment == 0 or stream.send_window + increment > f.MAX_WINDOW:
            self._reset(stream, f.PROTOCOL_ERROR if increment == 0 else f.FLOW_CONTROL_ERROR)
            return
        stream.send_window += increment
        self._flush(stream)

    # --- headers -----------------------------------------------------------------------------------
    def _on_headers(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        if flags & f.PADDED:
            payload = _unpad(payload)
        if flags & f.PRIORITY_FLAG:
            if len(payload) < 5:
                raise ConnectionError_(f.PROTOCOL_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        self._header_block = bytearray(payload)
        self._header_stream = stream_id
        self._header_end_stream = bool(flags & f.END_STREAM)
        if flags & f.END_HEADERS:
            self._headers_complete()

    def _on_continuation(self, stream_id: int, flags: int, payload: memoryview) -> None:
        block = self._header_block
        if block is None or stream_id != self._header_stream:
            raise ConnectionError_(f.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block += payload
        if len(block) > 2 * self._limits.max_header_list_bytes:
            raise ConnectionError_(f.PROTOCOL_ERROR, "header block too large")
        if flags & f.END_HEADERS:
            self._headers_complete()

    def _headers_complete(self) -> None:
        block, self._header_block = bytes(self._header_block or b""), None
        stream_id, end_stream = self._header_stream, self._header_end_stream
        headers = self._decode(block)
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client: only END_STREAM matters
            if not end_stream or stream.remote_closed:
                self._reset(stream, f.PROTOCOL_ERROR)
                return
            self._remote_end(stream)
            return
        if stream_id <= self._last_stream:
            return  # a closed stream: decoded (the table stays in step) and ignored
        self._last_stream = stream_id
        if self._draining:
            self._write(f.rst_stream(stream_id, f.REFUSED_STREAM))
            return
        path = b""
        for name, value in headers:
            if name == b":path":
                path = value
                break
        factory = self._methods.get(path)
        if factory is None:
            message = f"unknown method {path.decode('latin-1')!r}"
            block = f.RESPONSE_HEADERS + f.trailers(UNIMPLEMENTED, message)
            self._write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, block))
            if not end_stream:
                self._write(f.rst_stream(stream_id, f.NO_ERROR))
            return
        stream = _Stream(stream_id, factory(), self._limits.stream_window, self._peer_initial_window)
        self._streams[stream_id] = stream
        self.idle.clear()
        if end_stream:
            self._remote_end(stream)

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
            raise ConnectionError_(f.COMPRESSION_ERROR, f"undecodable header block: {exc}") from None
        if (table.maxsize, tuple(table.dynamic_entries)) != before:
            self._header_cache.clear()
        elif len(self._header_cache) < _HEADER_CACHE_BLOCKS:
            self._header_cache[block] = headers
        return headers

    # --- data --------------------------------------------------------------------------------------
    def _on_data(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ConnectionError_(f.FLOW_CONTROL_ERROR, "the peer overran the connection window")
        if self._recv_window < self._limits.connection_window // 2:
            self._write(f.window_update(0, self._limits.connection_window - self._recv_window))
            self._recv_window = self._limits.connection_window
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream:
                raise ConnectionError_(f.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # closed by us (or reset) while this was in flight
        if stream.remote_closed:
            self._reset(stream, f.STREAM_CLOSED)
            return
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._reset(stream, f.FLOW_CONTROL_ERROR)
            return
        if flags & f.PADDED:
            payload = _unpad(payload)
        end_stream = bool(flags & f.END_STREAM)
        if not stream.finished:
            self._messages(stream, payload)
        if end_stream:
            self._remote_end(stream)
        elif stream.recv_window < self._limits.stream_window // 2 and stream.id in self._streams:
            self._write(f.window_update(stream.id, self._limits.stream_window - stream.recv_window))
            stream.recv_window = self._limits.stream_window

    def _messages(self, stream: _Stream, payload: memoryview) -> None:
        """Cut gRPC messages (1-byte flag, 4-byte length, bytes) out of a stream's DATA."""
        buffer = stream.buffer
        if buffer:
            buffer += payload
            data: bytes | bytearray | memoryview = buffer
        else:
            data = payload  # the usual case: whole messages in one frame, no copy into a buffer
        position, end, limit = 0, len(data), self._limits.max_message_bytes
        while end - position >= _GRPC_PREFIX_BYTES:
            compressed = data[position]
            length = int.from_bytes(data[position + 1 : position + 5], "big")
            if compressed:
                self._finish(stream, UNIMPLEMENTED, "compressed messages are not supported")
                return
            if length > limit:
                message = f"grpc: received message larger than max ({length} vs. {limit})"
                self._finish(stream, RESOURCE_EXHAUSTED, message)
                return
            start = position + _GRPC_PREFIX_BYTES
            if end - start < length:
                break
            position = start + length
            self._message(stream, bytes(data[start:position]))
            if stream.finished:
                return
        if data is buffer:
            del buffer[:position]
        elif position < end:
            buffer += data[position:]

    # --- running handlers --------------------------------------------------------------------------
    def _message(self, stream: _Stream, message: bytes) -> None:
        if stream.task is not None:
            stream.queue.append(message)
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
        task = asyncio.get_running_loop().create_task(self._run_suspended(stream, coro, pending))
        stream.task = task
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._suspended_done, stream, coro))

    async def _run_suspended(self, stream: _Stream, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        try:
            result = await _continue(coro, pending)
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
            while stream.queue and stream.task is None and not stream.finished:
                self._message(stream, stream.queue.popleft())
            if stream.remote_closed and stream.task is None and not stream.finished:
                self._finish(stream, OK, "")
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
        stream.remote_closed = True
        if stream.buffer and not stream.finished:
            stream.buffer.clear()
            self._finish(stream, INVALID_ARGUMENT, "the stream ended inside a message")
            return
        if stream.task is None and not stream.finished:
            self._finish(stream, OK, "")
        elif stream.finished and stream.trailers is None:
            self._forget(stream)

    def _finish(self, stream: _Stream, status: int, message: str) -> None:
        """Decide the stream's status; trailers go out after any DATA still held by a window."""
        if stream.finished:
            return
        stream.finished = True
        stream.queue.clear()
        block = f.OK_TRAILERS if status == OK and not message else f.trailers(status, message)
        if not stream.headers_sent:
            stream.headers_sent = True
            block = f.RESPONSE_HEADERS + block  # trailers-only response
        stream.trailers = block
        self._flush(stream)
        self._release(stream)

    def _send_trailers(self, stream: _Stream) -> None:
        block, stream.trailers = stream.trailers, None
        assert block is not None
        self._write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream.id, block))
        if not stream.remote_closed:
            # The peer may still be sending; tell it to stop (as gRPC servers do).
            self._write(f.rst_stream(stream.id, f.NO_ERROR))
        self._forget(stream)

    def _forget(self, stream: _Stream) -> None:
        if self._streams.pop(stream.id, None) is not None:
            self._blocked.discard(stream)
            self._check_idle()

    def _reset(self, stream: _Stream, code: int) -> None:
        self._write(f.rst_stream(stream.id, code))
        self._streams.pop(stream.id, None)
        self._drop(stream)
        self._check_idle()

    def _drop(self, stream: _Stream) -> None:
        """The stream is gone (reset, connection lost): nothing more is sent; the handler is closed."""
        stream.finished = True
        stream.pending.clear()
        stream.trailers = None
        stream.queue.clear()
        self._blocked.discard(stream)
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
        if not self._streams:
            self.idle.set()

    # --- flow control on the way out ---------------------------------------------------------------
    def _flush(self, stream: _Stream) -> None:
        """Send what the windows allow of ``stream``'s DATA, then its trailers once nothing is held."""
        pending = stream.pending
        while pending:
            allowed = min(stream.send_window, self._send_window, self._peer_max_frame)
            if allowed <= 0:
                self._blocked.add(stream)
                return
            chunk = pending[0]
            if len(chunk) <= allowed:
                pending.popleft()
            else:
                pending[0], chunk = chunk[allowed:], chunk[:allowed]
            size = len(chunk)
            stream.send_window -= size
            self._send_window -= size
            self._write(f.frame(f.DATA, 0, stream.id, bytes(chunk)))
        self._blocked.discard(stream)
        if stream.trailers is not None:
            self._send_trailers(stream)

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked):
            if self._send_window <= 0:
                return
            self._flush(stream)


def _unpad(payload: memoryview) -> memoryview:
    if not payload:
        raise ConnectionError_(f.PROTOCOL_ERROR, "padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionError_(f.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
