"""Misbehaving API-server peers for the client's timeout and connection-bookkeeping tests.

The fake API server always answers and always closes politely; these do not: one never answers (nor
answers a TLS handshake), one hangs up after reading the request, one streams a watch and then
stops reading, so a TLS close it is sent is never answered (tests/sockets.py has a port that never
accepts, and the count of this process's sockets to a port).
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from types import TracebackType
from typing import cast

from harness.cluster.certs import TinyCA

CONDUCTS = ("silent", "hang-up", "watch", "late-watch", "deaf-watch", "deaf-get", "stalled-watch")
WATCH_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
AN_OBJECT = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
ONE_EVENT = b'{"type": "ADDED", "object": {"metadata": {"name": "p1", "resourceVersion": "5"}}}\n'


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Peer:
    """A TCP (or TLS) server on 127.0.0.1 whose conduct is one of:

    - ``silent``: accepts and never sends a byte (run without TLS and dialled over https, it never
      answers the client's handshake);
    - ``hang-up``: reads the request head, then closes the connection;
    - ``watch``: answers a watch with one event and keeps the stream open, answering a TLS close;
    - ``late-watch``: answers a watch, sends its one event after half a second, and ends it;
    - ``deaf-watch``: answers a watch with one event, then stops reading, so a TLS close_notify
      is never answered;
    - ``deaf-get``: answers any request with a whole JSON object, then stops reading (the same
      unanswered close, after a request that ended normally);
    - ``stalled-watch``: answers a watch, sends nothing more and stops reading.
    """

    def __init__(self, conduct: str, ssl_context: ssl.SSLContext | None = None) -> None:
        assert conduct in CONDUCTS, conduct
        self.conduct = conduct
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Peer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        self.reset_all()
        await self._server.wait_closed()

    def reset_all(self) -> None:
        """Drop every connection without a word (unread data pending: the kernel sends a reset)."""
        for writer in self._writers:
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if self.conduct == "silent":
            return  # the connection stays open until the test ends
        await reader.readuntil(b"\r\n\r\n")
        if self.conduct == "hang-up":
            writer.transport.abort()
            return
        if self.conduct == "late-watch":
            writer.write(WATCH_HEAD)
            await asyncio.sleep(0.5)  # the peer's pace, not a wait for an outcome
            writer.write(chunk(ONE_EVENT) + b"0\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        if self.conduct == "deaf-get":
            writer.write(AN_OBJECT)
        else:
            writer.write(WATCH_HEAD if self.conduct == "stalled-watch" else WATCH_HEAD + chunk(ONE_EVENT))
        await writer.drain()
        if self.conduct in ("deaf-watch", "deaf-get", "stalled-watch"):
            cast(asyncio.Transport, writer.transport).pause_reading()
            return
        await reader.read()  # until the client closes (TLS: its close_notify, answered in kind)
        writer.close()


def tls_pair(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context for 127.0.0.1 and a client context that trusts it."""
    ca = TinyCA()
    serving = ca.issue_serving([], ["127.0.0.1"])
    (tmp_path / "srv.crt").write_bytes(serving.cert_pem)
    (tmp_path / "srv.key").write_bytes(serving.key_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")
    return server_ctx, ssl.create_default_context(cadata=ca.cert_pem.decode())
