"""h2c (HTTP/2 over cleartext, prior knowledge) in front of the simulator's HTTP/1.1 application.

An InferencePool v1 with ``appProtocol: kubernetes.io/h2c`` tells the gateway to speak HTTP/2 to its
model servers. A real model server behind such a pool (uvicorn, hypercorn) answers both HTTP/1.1
and h2c on one port: the readiness probe and the EPP's metrics scrape stay HTTP/1.1. `H2cFront`
does that on the simulator's serving port. It reads a connection's first bytes: the HTTP/2
connection preface makes it an HTTP/2 connection, served here with the ``h2`` state machine, each
stream handed to the application as one HTTP/1.1 request over a Unix socket of its own; anything
else is an HTTP/1.1 connection, spliced byte for byte to the application's other Unix socket. The
application tells the two apart by the socket a request came in on (`H2cFront.H2_SOCKET`), so what
the simulator records as a request's HTTP version cannot be forged by a header.

What a stream becomes: ``:method`` and ``:path`` as the request line, ``:authority`` as ``Host``,
every other header as received (repeats kept), the whole body; the answer's status and headers
(hop-by-hop ones dropped, as HTTP/2 forbids them) and its body streamed back as DATA frames within
the peer's flow-control windows.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Final

import aiohttp
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError, StreamClosedError

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H1_SOCKET: Final = "h1.sock"
H2_SOCKET: Final = "h2.sock"
_READ = 64 * 1024
# Hop-by-hop headers: meaningless (and forbidden) in HTTP/2.
_HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "host"}
)


def _latin1(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class H2cFront:
    """The listener on ``host:port``; the application listens on ``socket_dir / H1_SOCKET`` and
    ``socket_dir / H2_SOCKET``. ``start()`` binds (port 0: any); ``stop()`` closes every connection."""

    def __init__(self, host: str, port: int, socket_dir: Path) -> None:
        self.host = host
        self.port = port
        self.socket_dir = socket_dir
        self._server: asyncio.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        connector = aiohttp.UnixConnector(path=str(self.socket_dir / H2_SOCKET))
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # the connection is the front's to cancel at stop
        try:
            first = b""
            while len(first) < len(PREFACE) and PREFACE.startswith(first):
                chunk = await reader.read(len(PREFACE) - len(first))
                if not chunk:
                    return
                first += chunk
            if first == PREFACE:
                await _H2Connection(self, reader, writer).serve(first)
            else:
                await self._splice(first, reader, writer)
        except (ConnectionError, ProtocolError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _splice(self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """An HTTP/1.1 connection: bytes both ways to the application's HTTP/1.1 socket."""
        app_reader, app_writer = await asyncio.open_unix_connection(str(self.socket_dir / H1_SOCKET))
        app_writer.write(first)

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(_READ):
                sink.write(data)
                await sink.drain()
            with contextlib.suppress(OSError):
                sink.write_eof()

        try:
            await asyncio.gather(pump(reader, app_writer), pump(app_reader, writer))
        finally:
            app_writer.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the h2c front is not started"
        return self._session


class _Stream:
    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.headers = headers
        self.body = bytearray()


class _H2Connection:
    """One HTTP/2 connection: frames in, each complete request forwarded, answers framed out."""

    def __init__(self, front: H2cFront, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._front = front
        self._reader = reader
        self._writer = writer
        self._conn = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        self._streams: dict[int, _Stream] = {}
        self._window_open = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data:
            self._writer.write(data)

    async def serve(self, first: bytes) -> None:
        self._conn.initiate_connection()
        self._on_data(first)
        try:
            while data := await self._reader.read(_READ):
                self._on_data(data)
                await self._writer.drain()
        finally:
            for task in list(self._handlers):
                task.cancel()
            if self._handlers:
                await asyncio.gather(*self._handlers, return_exceptions=True)

    def _on_data(self, data: bytes) -> None:
        for event in self._conn.receive_data(data):
            if isinstance(event, RequestReceived):
                headers = [(_latin1(k), _latin1(v)) for k, v in event.headers]
                self._streams[event.stream_id] = _Stream(headers)
                if event.stream_ended is not None:
                    self._dispatch(event.stream_id)
            elif isinstance(event, DataReceived):
                stream = self._streams.get(event.stream_id)
                if stream is not None:
                    stream.body += event.data
                self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if event.stream_ended is not None:
                    self._dispatch(event.stream_id)
            elif isinstance(event, StreamEnded):
                if event.stream_id in self._streams:
                    self._dispatch(event.stream_id)
            elif isinstance(event, StreamReset):
                self._streams.pop(event.stream_id, None)
                self._window_open.set()
            elif isinstance(event, WindowUpdated):
                self._window_open.set()
            elif isinstance(event, ConnectionTerminated):
                self._writer.close()
        self._flush()

    def _dispatch(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        task = asyncio.ensure_future(self._forward(stream_id, stream))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _forward(self, stream_id: int, stream: _Stream) -> None:
        pseudo = {k: v for k, v in stream.headers if k.startswith(":")}
        headers = [(k, v) for k, v in stream.headers if not k.startswith(":")]
        if ":authority" in pseudo:
            headers.insert(0, ("host", pseudo[":authority"]))
        url = f"http://h2c{pseudo.get(':path', '/')}"
        try:
            async with self._front.session.request(
                pseudo.get(":method", "GET"),
                url,
                headers=headers,
                data=bytes(stream.body),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                allow_redirects=False,
            ) as response:
                reply = [(":status", str(response.status))]
                reply += [
                    (_latin1(k).lower(), _latin1(v))
                    for k, v in response.raw_headers
                    if _latin1(k).lower() not in _HOP_BY_HOP
                ]
                self._conn.send_headers(stream_id, reply)
                self._flush()
                async for chunk in response.content.iter_any():
                    await self._send(stream_id, chunk)
            self._conn.end_stream(stream_id)
        except StreamClosedError:
            return
        except aiohttp.ClientError:
            with contextlib.suppress(ProtocolError):
                self._conn.reset_stream(stream_id)
        self._flush()

    async def _send(self, stream_id: int, data: bytes) -> None:
        """`data` on the stream, as the peer's windows allow (waiting for WINDOW_UPDATEs)."""
        view = memoryview(data)
        while view:
            window = min(self._conn.local_flow_control_window(stream_id), self._conn.max_outbound_frame_size)
            if window <= 0:
                self._window_open.clear()
                await self._window_open.wait()
                continue
            self._conn.send_data(stream_id, bytes(view[:window]))
            view = view[window:]
            self._flush()
            await self._writer.drain()
