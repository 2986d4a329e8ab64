"""The listener: accepts connections (TLS with ALPN ``h2``, or cleartext) and stops them gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from epp.h2.connection import Connection, Limits, StreamFactory


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
        self._stopping = False

    def add_method(self, path: str, factory: StreamFactory) -> None:
        self._methods[path.encode("ascii")] = factory

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port. No SO_REUSEPORT: a second
        server on the same port fails here instead of silently sharing it."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._new_connection, host, port, ssl=self._ssl, reuse_address=True, reuse_port=False
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
        return Connection(self._methods, self._limits, on_made=self._made, on_lost=self._connections.discard)

    def _made(self, connection: Connection) -> bool:
        """A connection finished its handshake; refused (False) once the server is stopping."""
        if self._stopping:
            return False
        self._connections.add(connection)
        return True


def server_ssl_context(certificate_file: str, key_file: str) -> ssl.SSLContext:
    """TLS 1.2+ serving ``certificate_file``/``key_file``, offering ALPN ``h2`` (what gRPC clients ask)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate_file, key_file)
    context.set_alpn_protocols(["h2"])
    return context
