"""The fault proxy: forwards both ways, freezes connections without closing them, cuts and restores."""

from __future__ import annotations

import contextlib
import gc
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from harness.base.eventually import eventually
from harness.base.ports import LOOPBACK
from harness.dataplane.tcp_proxy import TcpProxy
from tests.sockets import unaccepting_port

TIMEOUT_S = 5.0


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = True


@pytest.fixture
def echo() -> Iterator[int]:
    server = _Server((LOOPBACK, 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, name="echo", daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT_S)


@pytest.fixture
def proxy(echo: int) -> Iterator[TcpProxy]:
    with TcpProxy(LOOPBACK, echo) as proxy:
        yield proxy
    gc.collect()  # an unclosed socket or transport would warn (warnings are errors) here


def connect(proxy: TcpProxy) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, proxy.port), timeout=TIMEOUT_S)
    return sock


def echoes(sock: socket.socket, data: bytes = b"ping") -> bool:
    sock.sendall(data)
    return sock.recv(4096) == data


def test_forwards_both_ways_and_counts_connections(proxy: TcpProxy) -> None:
    with connect(proxy) as a, connect(proxy) as b:
        assert echoes(a)
        assert echoes(b, b"pong")
    assert proxy.accepted == 2


def test_freeze_stops_forwarding_but_keeps_the_connection_open(proxy: TcpProxy) -> None:
    with connect(proxy) as frozen:
        assert echoes(frozen)
        assert proxy.freeze() == 1

        frozen.settimeout(0.5)
        frozen.sendall(b"anyone?")  # the proxy's kernel still accepts the bytes ...
        with pytest.raises(TimeoutError):
            frozen.recv(4096)  # ... but nothing comes back, and no end of stream either

        with connect(proxy) as fresh:  # a new connection reaches the server again
            assert echoes(fresh)


def test_cut_closes_and_refuses_until_restored(proxy: TcpProxy) -> None:
    with connect(proxy) as open_one:
        assert echoes(open_one)
        assert proxy.cut() == 1
        assert open_one.recv(4096) == b"", "the open connection was closed"
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)

    proxy.restore()
    with connect(proxy) as again:
        assert echoes(again)


def test_stop_closes_frozen_connections(echo: int) -> None:
    proxy = TcpProxy(LOOPBACK, echo).start()
    client = connect(proxy)
    try:
        assert echoes(client)
        proxy.freeze()
        proxy.stop()
        assert client.recv(4096) == b"", "stopping the proxy closes what it froze"
    finally:
        client.close()
        proxy.stop()
    gc.collect()


def test_a_cut_closes_a_connection_whose_upstream_is_still_being_opened() -> None:
    """A partition cuts every connection, the half-made one too: left to finish its connect after the
    cut, it would be forwarded through a proxy that is meant to be cut off (and, made during a stop,
    be left open to the GC)."""
    with contextlib.ExitStack() as stack:
        proxy = stack.enter_context(TcpProxy(LOOPBACK, unaccepting_port(stack)))
        client = stack.enter_context(connect(proxy))

        def connecting() -> None:
            assert proxy.connecting == 1

        eventually(connecting, timeout=TIMEOUT_S)
        proxy.cut()
        assert client.recv(1) == b"", "the client's connection is closed"
        assert proxy.connecting == 0


def test_a_stop_while_an_upstream_connection_is_being_opened_leaves_no_socket() -> None:
    """The EPP reconnects all the time (short watches): a stop can fall between accepting a client
    and reaching the upstream. That half-made connection is abandoned cleanly, not left to the GC
    (whose "unclosed socket" warning then fails whichever test runs next)."""
    with contextlib.ExitStack() as stack:
        proxy = TcpProxy(LOOPBACK, unaccepting_port(stack)).start()
        try:
            client = stack.enter_context(connect(proxy))

            def connecting() -> None:
                assert proxy.connecting == 1

            eventually(connecting, timeout=TIMEOUT_S)
        finally:
            proxy.stop()
        assert client.recv(1) == b"", "the client's connection is closed"
        gc.collect()  # an unclosed socket or transport would warn (warnings are errors) here
