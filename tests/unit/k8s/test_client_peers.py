"""KubeClient against peers that misbehave: every request is bounded in time, every failure names
the request, the API server's certificate is checked even without a CA in the config, and no
connection outlives `close()` or stays in the client's books once it is gone.

The fake API server always answers and always closes politely, so none of this shows there; the
peers (peers.py) never answer, hang up, never accept, or never answer a TLS close.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from epp.k8s import client as client_module
from epp.k8s.client import PODS, KubeClient, WatchEvent
from epp.k8s.config import KubeConfig
from epp.k8s.errors import KubeConnectionError, WatchStalledError
from harness.base.eventually import eventually_async
from tests.sockets import client_sockets_to, unaccepting_port

from .peers import Peer, tls_pair
from .support import WAIT, drain, plain_config, run

PODS_PATH = "/api/v1/namespaces/ns1/pods"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/ns1/leases"

Call = Callable[[KubeClient], Awaitable[object]]


async def first_event(client: KubeClient) -> WatchEvent:
    """Read one event of a pods watch, then walk away from the stream (the connection is abandoned)."""
    stream = client.watch(PODS, "ns1", "1")
    async with contextlib.aclosing(stream):
        async for event in stream:
            return event
    raise AssertionError("the watch ended without an event")


async def read_all(client: KubeClient, idle_timeout: float | None = None) -> None:
    await drain(client.watch(PODS, "ns1", "1", idle_timeout=idle_timeout))


@pytest.mark.parametrize(
    ("method", "path", "call"),
    [
        pytest.param("GET", PODS_PATH, lambda c: c.list(PODS, "ns1"), id="list"),
        pytest.param("POST", LEASES, lambda c: c.create_object(LEASES, {"spec": {}}), id="create"),
        pytest.param("PUT", f"{LEASES}/l1", lambda c: c.replace_object(f"{LEASES}/l1", {}), id="replace"),
    ],
)
def test_a_request_nobody_answers_fails_after_the_request_timeout_and_names_itself(
    method: str, path: str, call: Call
) -> None:
    """A list, or a Lease write (leadership renewals depend on it), that the server accepts and never
    answers fails after `request_timeout`; aiohttp's own default would wait five minutes."""

    async def main() -> None:
        async with Peer("silent") as peer, KubeClient(plain_config(peer.url), request_timeout=0.3) as client:
            with pytest.raises(KubeConnectionError) as caught:
                await asyncio.wait_for(call(client), WAIT)
            assert str(caught.value) == f"{method} {peer.url}{path}: TimeoutError()"

    run(main)


@pytest.mark.parametrize(
    ("says", "call"),
    [
        pytest.param(f"GET {{url}}{PODS_PATH}", lambda c: c.list(PODS, "ns1"), id="list"),
        pytest.param(f"watch {{url}}{PODS_PATH}", read_all, id="watch"),
    ],
)
def test_a_server_that_hangs_up_is_a_connection_error_that_names_the_request(says: str, call: Call) -> None:
    """The informer logs this text when it backs off: it must say which request, and why."""

    async def main() -> None:
        async with Peer("hang-up") as peer, KubeClient(plain_config(peer.url)) as client:
            with pytest.raises(KubeConnectionError) as caught:
                await asyncio.wait_for(call(client), WAIT)
            expected = says.format(url=peer.url) + ": ServerDisconnectedError('Server disconnected')"
            assert str(caught.value) == expected

    run(main)


def test_a_watch_whose_connection_is_never_accepted_fails_after_the_request_timeout() -> None:
    """Connecting is bounded by `request_timeout` for a watch too (its idle limit only starts once
    connected): a peer whose accept queue is full drops the SYN and the connect would hang."""

    async def main(port: int) -> None:
        async with KubeClient(plain_config(f"http://127.0.0.1:{port}"), request_timeout=0.3) as client:
            with pytest.raises(
                KubeConnectionError, match=re.escape(f"watch http://127.0.0.1:{port}{PODS_PATH}: ")
            ):
                await asyncio.wait_for(read_all(client), WAIT)

    with contextlib.ExitStack() as stack:
        port = unaccepting_port(stack)
        run(lambda: main(port))


def test_a_watch_given_no_idle_limit_waits_twice_its_timeout_for_an_event() -> None:
    """The first event of a 10-second watch comes after half a second: well inside the default idle
    limit (20 s), so the watch is not declared stalled."""

    async def main() -> None:
        async with Peer("late-watch") as peer, KubeClient(plain_config(peer.url)) as client:
            seen: list[WatchEvent] = []
            await drain(client.watch(PODS, "ns1", "1", timeout_seconds=10), seen)
            assert [(e.type, e.resource_version) for e in seen] == [("ADDED", "5")]

    run(main)


@pytest.mark.parametrize(
    ("says", "call"),
    [
        pytest.param("GET {url}", lambda c: c.list(PODS, "ns1"), id="list"),
        pytest.param("watch {url}", read_all, id="watch"),
    ],
)
def test_a_tls_handshake_never_answered_fails_after_the_request_timeout(says: str, call: Call) -> None:
    """A peer that accepts the connection and never answers the ClientHello: the handshake is part
    of connecting, so a watch is bounded by `request_timeout` here too, not by its idle limit (which
    would be 120 s for a default watch) nor by asyncio's 60-s handshake timeout."""

    async def main() -> None:
        async with Peer("silent") as peer:  # plain TCP: it never speaks TLS
            url = f"https://127.0.0.1:{peer.port}"
            config = KubeConfig(server=url, ssl_context=ssl.create_default_context())
            async with KubeClient(config, request_timeout=0.3) as client:
                started = asyncio.get_running_loop().time()
                with pytest.raises(KubeConnectionError) as caught:
                    await asyncio.wait_for(call(client), WAIT)
                took = asyncio.get_running_loop().time() - started
        assert str(caught.value).startswith(says.format(url=url) + PODS_PATH)
        assert "Timeout" in str(caught.value)
        assert took < WAIT / 2

    run(main)


def test_an_https_server_is_verified_against_the_system_trust_when_the_config_names_no_ca(
    tmp_path: Path,
) -> None:
    """No CA in the config means the system's trust store, never "trust anyone": a certificate from
    a private CA is refused."""
    server_ctx, _ = tls_pair(tmp_path)

    async def main() -> None:
        async with (
            Peer("watch", server_ctx) as peer,
            KubeClient(KubeConfig(server=peer.url, ssl_context=None)) as client,
        ):
            with pytest.raises(KubeConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
                await asyncio.wait_for(client.list(PODS, "ns1"), WAIT)

    run(main)


def test_a_watch_abandoned_mid_stream_is_closed_before_close_returns(tmp_path: Path) -> None:
    """Over TLS a connection walked away from still needs the loop for its close_notify exchange:
    `close()` waits for it, so an owner that closes the loop next leaves no half-closed socket."""
    server_ctx, client_ctx = tls_pair(tmp_path)

    async def main() -> None:
        async with Peer("watch", server_ctx) as peer:
            client = KubeClient(KubeConfig(server=peer.url, ssl_context=client_ctx))
            await first_event(client)
            await client.close()
            assert client_sockets_to(peer.port) == 0

    run(main)


def test_nothing_is_kept_for_a_connection_once_it_has_closed(tmp_path: Path) -> None:
    """A watch is renewed about once a minute per kind for as long as the EPP runs: the client must
    forget each abandoned connection once it has closed, or its books grow without bound."""
    server_ctx, client_ctx = tls_pair(tmp_path)

    async def main() -> None:
        async with (
            Peer("watch", server_ctx) as peer,
            KubeClient(KubeConfig(server=peer.url, ssl_context=client_ctx)) as client,
        ):
            for _ in range(3):
                await first_event(client)

            async def forgotten() -> None:
                assert client_sockets_to(peer.port) == 0
                assert not client._open

            await eventually_async(forgotten, timeout=WAIT)

    run(main)


def test_a_peer_that_never_answers_the_tls_close_is_dropped_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close()` waits CLOSE_GRACE for the peer's close_notify, then aborts: it never hangs on a peer
    that stopped reading (asyncio's own limit is 30 s)."""
    monkeypatch.setattr(client_module, "CLOSE_GRACE", 0.3)
    server_ctx, client_ctx = tls_pair(tmp_path)

    async def main() -> None:
        async with Peer("deaf-watch", server_ctx) as peer:
            client = KubeClient(KubeConfig(server=peer.url, ssl_context=client_ctx))
            await first_event(client)
            await asyncio.wait_for(client.close(), WAIT)
            assert client_sockets_to(peer.port) == 0

    run(main)


def test_a_request_that_ended_normally_is_closed_before_close_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request's connection is closed after its response (force_close), and over TLS that
    close waits on the peer's close_notify: `close()` waits for it too (up to CLOSE_GRACE), or an
    owner that closes the loop next leaves the socket to the garbage collector (a ResourceWarning in
    whatever runs then; seen in CI after an in-process EPP stopped just after a list)."""
    monkeypatch.setattr(client_module, "CLOSE_GRACE", 0.3)
    server_ctx, client_ctx = tls_pair(tmp_path)

    async def main() -> None:
        async with Peer("deaf-get", server_ctx) as peer:
            client = KubeClient(KubeConfig(server=peer.url, ssl_context=client_ctx))
            assert await client.get_object("/api/v1/namespaces/ns1/pods/p1") == {}
            await asyncio.wait_for(client.close(), WAIT)
            assert client_sockets_to(peer.port) == 0

    run(main)


def test_a_stalled_watch_s_connection_is_dropped_at_once(tmp_path: Path) -> None:
    """A watch that read nothing for its idle limit is on a dead connection: it is aborted, not closed
    politely (a TLS close nobody answers would hold the socket for asyncio's 30 s)."""
    server_ctx, client_ctx = tls_pair(tmp_path)

    async def main() -> None:
        async with (
            Peer("stalled-watch", server_ctx) as peer,
            KubeClient(KubeConfig(server=peer.url, ssl_context=client_ctx)) as client,
        ):
            with pytest.raises(WatchStalledError):
                await read_all(client, idle_timeout=0.3)

            async def dropped() -> None:
                assert client_sockets_to(peer.port) == 0

            await eventually_async(dropped, timeout=WAIT)

    run(main)


def test_a_connection_reset_while_closing_leaves_no_unretrieved_error(tmp_path: Path) -> None:
    """A peer that resets an abandoned connection during its TLS close ends it in an error that is
    expected: it is consumed, never logged by asyncio as "Future exception was never retrieved"."""
    server_ctx, client_ctx = tls_pair(tmp_path)

    async def main() -> list[str]:
        reported: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: reported.append(context["message"])
        )
        async with (
            Peer("deaf-watch", server_ctx) as peer,
            KubeClient(KubeConfig(server=peer.url, ssl_context=client_ctx)) as client,
        ):
            await first_event(client)
            peer.reset_all()

            async def closed() -> None:
                assert not client._open

            await eventually_async(closed, timeout=WAIT)
        gc.collect()  # an unretrieved exception is reported when its future is collected
        return reported

    assert run(main) == []
