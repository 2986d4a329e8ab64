"""A `Connection` wired to an independent HTTP/2 client (the `h2` library) through memory, no sockets.

The client is a full RFC 9113 implementation that enforces the protocol on what the server sends
(flow control, stream states, header validity), so a test sees exactly what a peer would.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
from hpack import Encoder

from epp.h2 import frames as f
from epp.h2.connection import Connection, GrpcStream, Limits
from epp.h2.limits import GOAWAY_GRACE

PATH = "/test.Echo/Chat"


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), len(payload)) + payload


def grpc_messages(data: bytes) -> list[bytes]:
    """Cut a DATA stream into gRPC messages (asserting it holds only whole ones)."""
    out, position = [], 0
    while position < len(data):
        flag, length = struct.unpack_from(">BI", data, position)
        assert flag == 0
        out.append(data[position + 5 : position + 5 + length])
        position += 5 + length
    assert position == len(data)
    return out


class FakeTimer:
    def __init__(self, due: float, callback: Callable[[], None]) -> None:
        self.due = due
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A connection's ``Clock`` whose time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move time on, running every timer that falls due (including ones armed on the way)."""
        end = self.now + seconds
        while True:
            due = [t for t in self.timers if not t.cancelled and t.due <= end]
            if not due:
                break
            timer = min(due, key=lambda t: t.due)
            self.timers.remove(timer)
            self.now = max(self.now, timer.due)
            timer.callback()
        self.now = end

    @property
    def armed(self) -> int:
        return sum(1 for t in self.timers if not t.cancelled)


class FakeTransport:
    """What the Connection writes; ``close`` is remembered (the test calls ``connection_lost``)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.written: list[bytes] = []  # every write, kept (``chunks`` is emptied by ``take``)
        self.closed = False
        self.aborted = False
        self.reading = True
        self.buffered = 0  # what get_write_buffer_size answers (the peer has not read that much)
        self.high_water: int | None = None

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.chunks.append(bytes(data))
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high_water = high

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def take(self) -> bytes:
        data, self.chunks = b"".join(self.chunks), []
        return data

    def mark(self) -> int:
        """A place in everything written, for ``since``."""
        return len(self.written)

    def since(self, mark: int) -> bytes:
        """What was written after ``mark`` (``Wire.pump`` hands it on to the client, so ``take`` no
        longer has it)."""
        return b"".join(self.written[mark:])


@dataclass
class Recorder:
    """Every handler the server made: the messages each got, and how often it was closed."""

    handlers: list[Handler] = field(default_factory=list)

    def factory(self, script: Script) -> Any:
        def make() -> Handler:
            handler = Handler(script)
            self.handlers.append(handler)
            return handler

        return make


@dataclass
class Script:
    """How handlers answer: ``reply(message)`` → (reply, end); ``gate`` set → a message starting with
    b"wait" waits on it; one starting with b"yield" gives way to the loop once."""

    end_on: bytes = b"end"
    fail_on: dict[bytes, Callable[[], BaseException]] = field(default_factory=dict)
    gate: asyncio.Future[None] | None = None
    fail_when_cancelled: bool = False  # a handler whose clean-up on cancellation raises
    close_fails: bool = False  # a handler whose close() raises (after counting the call)

    def reply(self, message: bytes) -> tuple[bytes | None, bool]:
        if message in self.fail_on:
            raise self.fail_on[message]()
        if message == b"silent":
            return None, False
        return b"re:" + message, message == self.end_on


class Handler:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.messages: list[bytes] = []
        self.closed = 0
        self.cancelled = False

    async def handle(self, message: bytes) -> tuple[bytes | None, bool]:
        assert not self.closed, "handle after close"
        self.messages.append(message)
        if message.startswith(b"yield"):
            await asyncio.sleep(0)  # a bare yield (no future), as a handler giving way to others does
        gate = self.script.gate
        if gate is not None and message.startswith(b"wait"):
            try:
                await gate
            except asyncio.CancelledError:
                self.cancelled = True
                if self.script.fail_when_cancelled:
                    raise RuntimeError("clean-up failed") from None
                raise
        return self.script.reply(message)

    def close(self) -> None:
        self.closed += 1
        if self.script.close_fails:
            raise RuntimeError("close failed")


_typed: GrpcStream = Handler(Script())


@dataclass
class StreamResult:
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    data: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    ended: bool = False
    reset: int | None = None

    @property
    def status(self) -> int | None:
        block = dict(self.trailers or self.headers)
        value = block.get(b"grpc-status")
        return None if value is None else int(value)

    @property
    def message(self) -> str:
        return dict(self.trailers or self.headers).get(b"grpc-message", b"").decode()

    @property
    def replies(self) -> list[bytes]:
        return grpc_messages(self.data)


class Wire:
    """Server ``Connection`` ⇄ ``h2`` client, pumped by hand."""

    def __init__(
        self,
        script: Script | None = None,
        limits: Limits | None = None,
        client_settings: dict[int, int] | None = None,
        ack_data: bool = True,
    ) -> None:
        """``ack_data=False``: the client never gives flow-control credit back by itself."""
        self.ack_data = ack_data
        self.recorder = Recorder()
        self.script = script or Script()
        self.transport = FakeTransport()
        self.clock = FakeClock()
        self.server = Connection(
            {PATH.encode(): self.recorder.factory(self.script)}, limits or Limits(), clock=self.clock
        )
        self.server.connection_made(self.transport)  # type: ignore[arg-type]
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.client = h2.connection.H2Connection(config)
        self.client.initiate_connection()
        if client_settings:
            self.client.update_settings(client_settings)
        self.results: dict[int, StreamResult] = {}
        self.events: list[h2.events.Event] = []
        self.pump()

    # --- sending -----------------------------------------------------------------------------------
    def open(self, path: str = PATH, end_stream: bool = False) -> int:
        stream_id = self.client.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "test"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        self.client.send_headers(stream_id, headers, end_stream=end_stream)
        self.results[stream_id] = StreamResult()
        return stream_id

    def send(self, stream_id: int, *messages: bytes, end: bool = False, **kwargs: Any) -> None:
        self.client.send_data(
            stream_id, b"".join(grpc_message(m) for m in messages), end_stream=end, **kwargs
        )

    def send_bytes(self, stream_id: int, data: bytes, end: bool = False) -> None:
        """``data`` as DATA frames no larger than the server allows."""
        size = self.client.max_outbound_frame_size
        for start in range(0, len(data), size):
            last = start + size >= len(data)
            self.client.send_data(stream_id, data[start : start + size], end_stream=end and last)

    def answer_to(self, stream_id: int, payload: bytes) -> bytes:
        """What the server wrote while one DATA frame of ``payload`` was pumped."""
        before = self.transport.mark()
        self.client.send_data(stream_id, payload)
        self.pump()
        return self.transport.since(before)

    def raw(self, data: bytes) -> None:
        """Bytes straight to the server (frames the client library would never write)."""
        self.server.data_received(data)

    # --- receiving ---------------------------------------------------------------------------------
    def pump(self) -> list[h2.events.Event]:
        """Move bytes both ways until neither side has anything to say; return the client's events."""
        seen: list[h2.events.Event] = []
        while True:
            outgoing = self.client.data_to_send()
            if outgoing and not self.transport.closed:
                self.server.data_received(outgoing)
            incoming = self.transport.take()
            if not outgoing and not incoming:
                break
            if incoming:
                events = self.client.receive_data(incoming)
                seen += events
                self._record(events)
        self.events += seen
        return seen

    async def settle(self) -> list[h2.events.Event]:
        """Let suspended handlers run, then pump."""
        for _ in range(5):
            await asyncio.sleep(0)
        return self.pump()

    def _record(self, events: Sequence[h2.events.Event]) -> None:
        for event in events:
            stream_id = getattr(event, "stream_id", None)
            if not stream_id:
                continue
            result = self.results.setdefault(stream_id, StreamResult())
            if isinstance(event, h2.events.ResponseReceived):
                result.headers = list(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                result.data += event.data
                if self.ack_data:
                    self.client.acknowledge_received_data(event.flow_controlled_length, stream_id)
            elif isinstance(event, h2.events.TrailersReceived):
                result.trailers = list(event.headers)
            elif isinstance(event, h2.events.StreamEnded):
                result.ended = True
            elif isinstance(event, h2.events.StreamReset):
                result.reset = event.error_code

    def ended(self) -> bool:
        """Whether the server closed the connection, once a GOAWAY's linger is over."""
        self.clock.advance(GOAWAY_GRACE)
        return self.transport.closed

    def lose(self) -> None:
        self.transport.close()
        self.server.connection_lost(None)

    @property
    def goaway(self) -> h2.events.ConnectionTerminated | None:
        ends = [e for e in self.events if isinstance(e, h2.events.ConnectionTerminated)]
        return ends[-1] if ends else None


def header_block(path: str = PATH) -> bytes:
    """A request header block encoded by an independent HPACK encoder."""
    return Encoder().encode(
        [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "test")]
    )


def frames_in(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """Raw server output as (type, flags, stream id, payload) per frame."""
    out, position = [], 0
    while position + 9 <= len(data):
        high, low, kind, flags, stream_id = f.FRAME_HEADER.unpack_from(data, position)
        length = (high << 8) | low
        out.append((kind, flags, stream_id, data[position + 9 : position + 9 + length]))
        position += 9 + length
    return out


def window_updates(data: bytes) -> list[tuple[int, int]]:
    """(stream, increment) of every WINDOW_UPDATE in ``data``, in order."""
    return [
        (stream, f.U32.unpack(payload)[0])
        for kind, _, stream, payload in frames_in(data)
        if kind == f.WINDOW_UPDATE
    ]


def resets_in(data: bytes) -> dict[int, int]:
    """Stream id → error code of every RST_STREAM in ``data`` (raw server output)."""
    return {
        sid: int(f.U32.unpack(payload)[0])
        for kind, _, sid, payload in frames_in(data)
        if kind == f.RST_STREAM
    }


def goaway_code(data: bytes) -> int | None:
    """The error code of the first GOAWAY frame in ``data`` (raw server output), if any."""
    for kind, _flags, _stream, payload in frames_in(data):
        if kind == f.GOAWAY:
            return int(f.U32.unpack_from(payload, 4)[0])
    return None


def goaway_debug(data: bytes) -> str | None:
    """The debug data of the first GOAWAY frame in ``data``: what the server tells the peer was wrong."""
    for kind, _flags, _stream, payload in frames_in(data):
        if kind == f.GOAWAY:
            return bytes(payload[8:]).decode("utf-8", "replace")
    return None


def suspended_stream(limits: Limits | None = None) -> tuple[Wire, int, asyncio.Future[None]]:
    """A stream whose handler waits in ``handle(b"wait")`` on the returned gate (in a running loop);
    what the server wrote so far is taken."""
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    wire = Wire(Script(gate=gate), limits=limits)
    sid = wire.open()
    wire.send(sid, b"wait")
    wire.pump()
    wire.transport.take()
    return wire, sid, gate
