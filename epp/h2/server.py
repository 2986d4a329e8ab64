"""The listener: accepts connections (TLS with ALPN ``h2``, or cleartext) and stops them gracefully.

At most ``Limits.max_connections`` connections at once: one more is answered SETTINGS and GOAWAY
ENHANCE_YOUR_CALM and closed. A TLS handshake must finish within the preface timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable

from epp.h2 import frames as f
from epp.h2.connection import Connection, Timer
from epp.h2.limits import Limits
from epp.h2.streams import StreamFactory


class GrpcServer:
    """gRPC bidirectional-streaming methods over HTTP/2 on the running event loop.

    ``add_method("/pkg.Service/Method", factory)`` before ``start``; ``factory()`` makes the handler
    of one stream (``epp.h2.GrpcStream``). ``stop(grace)`` works like grpc's: no new streams (GOAWAY),
    streams already open get ``grace`` seconds to end, then every connection is closed.
    """

    def __init__(self, *, limits: Limits | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self._limits = limits if limits is not None else Limits()
        self._ssl = ssl_context
        self._methods: dict[bytes, StreamFactory] = {}
        self._connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._clock: _LoopClock | None = None
        self._stopping = False

    def add_method(self, path: str, factory: StreamFactory) -> None:
        self._methods[path.encode("ascii")] = factory

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port. No SO_REUSEPORT: a second
        server on the same port fails here instead of silently sharing it."""
        loop = asyncio.get_running_loop()
        self._clock = _LoopClock(loop)
        handshake = self._limits.preface_timeout if self._ssl is not None else None
        self._server = await loop.create_server(
            self._new_connection,
            host,
            port,
            ssl=self._ssl,
            reuse_address=True,
            reuse_port=False,
            ssl_handshake_timeout=handshake or None,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace: float | None) -> None:
        """GOAWAY to every connection, wait up to ``grace`` seconds for open streams, then close all."""
        self._stopping = True
        server, self._server = self._server, None
        if server is None:
            if grace is None:  # a hurried stop beside a graceful one: cut its streams short now
                for connection in list(self._connections):
                    connection.close()
            return
        server.close()
        connections = list(self._connections)
        for connection in connections:
            connection.drain()
        if grace and connections:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(c.idle.wait() for c in connections)), grace)
        for connection in connections:
            connection.close()
        await asyncio.gather(*(c.wait_closed() for c in connections), return_exceptions=True)
        await server.wait_closed()

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def _new_connection(self) -> Connection:
        return Connection(
            self._methods,
            self._limits,
            on_made=self._made,
            on_lost=self._connections.discard,
            clock=self._clock,
        )

    def _made(self, connection: Connection) -> int | None:
        """A connection finished its handshake; refused (with an error code) once the server is
        stopping or holds as many connections as it may."""
        if self._stopping:
            return f.NO_ERROR
        if len(self._connections) >= self._limits.max_connections:
            return f.ENHANCE_YOUR_CALM
        self._connections.add(connection)
        return None


class _LoopClock:
    """The event loop as a connection's ``Clock``."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def time(self) -> float:
        return self._loop.time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self._loop.call_later(delay, callback)


def server_ssl_context(certificate_file: str, key_file: str) -> ssl.SSLContext:
    """TLS 1.2+ serving ``certificate_file``/``key_file``, offering ALPN ``h2`` (what gRPC clients ask)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate_file, key_file)
    context.set_alpn_protocols(["h2"])
    return context
