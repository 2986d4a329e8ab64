"""A TCP proxy between a client (the EPP) and a server (the API server), to break the connection
the ways a network does, without touching either process.

* `freeze()`: every connection open now stops forwarding, both ways, and stays open: no FIN, no RST,
  and the proxy's kernel keeps ACKing. To the client that is a half-open connection, as when a
  middlebox that held it restarts or a peer vanishes behind a NAT, and TCP keepalive cannot see it
  (the proxy answers the probes). Connections opened afterwards are forwarded normally, as a new
  connection would reach a live server again: only a client that notices the dead one recovers.
* `cut()`: every open connection is closed (one still reaching the upstream too) and new ones are
  refused until `restore()` (the same port listens again): a partition.
* `stop()`: closes everything and joins the proxy's thread.

One thread with its own event loop; the connections are touched only on that loop. The port is
reserved (`harness.base.ports`) for the proxy's whole life, so `restore()` gets it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

from harness.base.lifecycle import StartStop
from harness.base.ports import LOOPBACK, PortReservation, reserve_port

T = TypeVar("T")

_CHUNK = 64 * 1024
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


class _Link:
    """One client connection and its upstream connection; `task` pumps bytes both ways."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.task: asyncio.Task[None] | None = None

    async def stop_forwarding(self) -> None:
        """Stop the pumps; the sockets stay open."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def close(self) -> None:
        await self.stop_forwarding()
        for writer in (self.client, self.upstream):
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then pass the half-close on."""
    while data := await reader.read(_CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


class TcpProxy(StartStop):
    """Forwards `LOOPBACK:port` to `upstream_host:upstream_port`; see the module docstring."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self._reservation: PortReservation | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._frozen: set[_Link] = set()
        # Connections accepted whose upstream connection is still being opened: `_close_all`
        # cancels them, or a stop in that moment would leave the upstream socket to the GC.
        self._connecting: set[asyncio.Task[Any]] = set()
        self._accepted = 0

    # ------------------------------------------------------------------ addresses and counts
    @property
    def port(self) -> int:
        if self._reservation is None:
            raise RuntimeError("the proxy is not started")
        return self._reservation.port

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def accepted(self) -> int:
        """Connections forwarded since start (a client that reconnects shows here)."""
        return self._run(self._count())

    async def _count(self) -> int:
        return self._accepted

    @property
    def connecting(self) -> int:
        """Connections accepted whose upstream connection is still being opened."""
        return self._run(self._count_connecting())

    async def _count_connecting(self) -> int:
        return len(self._connecting)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("the proxy is already started")
        self._reservation = reserve_port()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="tcp-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(_START_TIMEOUT_S):
            self.stop()
            raise TimeoutError("the TCP proxy's loop did not start")
        try:
            self._run(self._listen())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Close every connection and the listener, stop the loop, join the thread. Idempotent."""
        thread, loop = self._thread, self._loop
        if thread is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(_STOP_TIMEOUT_S)
                loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(_STOP_TIMEOUT_S)
            if thread.is_alive():
                raise TimeoutError("the TCP proxy's thread did not stop")
        self._thread = None
        if self._reservation is not None:
            self._reservation.release()
            self._reservation = None

    # ------------------------------------------------------------------ faults
    def freeze(self) -> int:
        """Stop forwarding on every open connection without closing it; returns how many."""
        return self._run(self._freeze())

    def cut(self) -> int:
        """Close every open connection and refuse new ones until `restore()`; returns how many closed."""
        return self._run(self._cut())

    def restore(self) -> None:
        """Listen again on the same port after `cut()`."""
        self._run(self._listen())

    # ------------------------------------------------------------------ on the proxy's loop
    def _main(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.call_soon(ready.set)
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(_STOP_TIMEOUT_S)

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._accept, LOOPBACK, self.port, reuse_address=True)

    async def _accept(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        connecting = asyncio.current_task()
        assert connecting is not None
        self._connecting.add(connecting)
        try:
            upstream_reader, upstream = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except (OSError, asyncio.CancelledError):
            client.close()
            return
        finally:
            self._connecting.discard(connecting)
        link = _Link(client, upstream)
        self._links.add(link)
        self._accepted += 1
        link.task = asyncio.create_task(self._forward(link, client_reader, upstream_reader))

    async def _forward(
        self, link: _Link, client_reader: asyncio.StreamReader, upstream_reader: asyncio.StreamReader
    ) -> None:
        """Both ways until both ends are done (or one fails), then close both, as a proxy does.

        Cancelled by `freeze()`: the pumps stop and the sockets are left open.
        """
        pumps = [
            asyncio.create_task(_pump(client_reader, link.upstream)),
            asyncio.create_task(_pump(upstream_reader, link.client)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        self._links.discard(link)
        for writer in (link.client, link.upstream):
            writer.close()

    async def _freeze(self) -> int:
        links, self._links = self._links, set()
        for link in links:
            await link.stop_forwarding()  # the sockets stay open: nothing is read, nothing is sent
        self._frozen |= links
        return len(links)

    async def _cut(self) -> int:
        """Stop accepting, abandon the connections still reaching the upstream, close the rest.

        In that order: a connection whose upstream connect completed while the open ones were being
        closed would otherwise become a link after them, forwarded through a cut proxy (and, in a
        stop, left open to the GC)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        connecting, self._connecting = self._connecting, set()
        for task in connecting:
            task.cancel()
        await asyncio.gather(*connecting, return_exceptions=True)
        links, self._links = self._links, set()
        for link in links:
            await link.close()
        return len(links)

    async def _close_all(self) -> None:
        await self._cut()
        frozen, self._frozen = self._frozen, set()
        for link in frozen:
            await link.close()
