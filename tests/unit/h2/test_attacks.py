"""Attacks on `epp.h2.GrpcServer` over real loopback sockets (`harness.stress.h2_attacks`): each gets
the GOAWAY or RST_STREAM code it should, its connection ends where it should, and a normal gRPC call
on another connection (grpcio's client) is answered meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc
import pytest

from epp.h2 import GrpcServer, Limits
from epp.h2 import frames as f
from epp.server.tls import self_signed, ssl_context
from harness.stress.h2_attacks import ATTACKS, HOLD_PATH, SECONDS, STOPPED_AS_OURS, Outcome, RawPeer, Target

from .support import Recorder, Script

# Short timeouts so the slow attacks end quickly; every other limit is the default.
LIMITS = Limits(preface_timeout=0.5, header_timeout=0.5, idle_timeout=30.0)


@asynccontextmanager
async def attacked(
    limits: Limits = LIMITS, tls: bool = False
) -> AsyncIterator[tuple[int, grpc.aio.Channel, ssl.SSLContext | None]]:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # "wait..." never returns
    pair = self_signed() if tls else None
    server = GrpcServer(limits=limits, ssl_context=ssl_context(pair) if pair is not None else None)
    server.add_method(HOLD_PATH, Recorder().factory(Script(gate=gate)))
    port = await server.start("127.0.0.1", 0)
    client_tls: ssl.SSLContext | None = None
    if pair is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=pair.cert_pem)
        options = (("grpc.ssl_target_name_override", "localhost"),)
        channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options)
        client_tls = ssl.create_default_context(cadata=pair.cert_pem.decode())
        client_tls.set_alpn_protocols(["h2"])
    else:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield port, channel, client_tls
    finally:
        await channel.close()
        await server.stop(None)
        gate.cancel()


async def normal_call(channel: grpc.aio.Channel) -> bytes:
    call = channel.stream_stream(HOLD_PATH)()
    await call.write(b"hello")
    reply = await call.read()
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK
    assert isinstance(reply, bytes)
    return reply


def calm(outcome: Outcome) -> bool:
    return outcome.goaway == f.ENHANCE_YOUR_CALM and outcome.closed


def target(port: int, tls: ssl.SSLContext | None = None) -> Target:
    return Target("127.0.0.1", port, tls, HOLD_PATH, b"wait")


@pytest.mark.parametrize(("name", "expected"), [pytest.param(n, e, id=n) for n, e in STOPPED_AS_OURS.items()])
def test_an_attack_is_stopped_and_a_normal_call_is_answered_meanwhile(
    name: str, expected: Callable[[Outcome], bool]
) -> None:
    async def scenario() -> None:
        async with attacked() as (port, channel, _):
            assert await normal_call(channel) == b"re:hello"  # connected before the attack
            attack = asyncio.create_task(ATTACKS[name](target(port), SECONDS.get(name, 10.0)))
            answered = 0
            while not attack.done():
                assert await normal_call(channel) == b"re:hello"
                answered += 1
            outcome = await attack
            assert expected(outcome), f"{name}: {outcome}"
            assert answered > 0
            assert await normal_call(channel) == b"re:hello"

    asyncio.run(scenario())


@pytest.mark.parametrize("name", ["ping-flood-no-read", "slowloris-mid-header", "idle-connection"])
def test_attacks_over_tls_are_stopped_too(name: str) -> None:
    async def scenario() -> None:
        async with attacked(tls=True) as (port, channel, client_tls):
            assert await normal_call(channel) == b"re:hello"
            outcome = await ATTACKS[name](target(port, client_tls), 10.0)
            assert calm(outcome), f"{name}: {outcome}"
            assert await normal_call(channel) == b"re:hello"

    asyncio.run(scenario())


def test_connections_past_the_cap_are_refused_and_the_others_served() -> None:
    async def scenario() -> None:
        async with attacked(Limits(max_connections=3)) as (port, channel, _):
            assert await normal_call(channel) == b"re:hello"  # the first of the three
            peers = [await RawPeer.connect("127.0.0.1", port) for _ in range(3)]
            try:
                for peer in peers:
                    peer.handshake()
                outcomes = [await peer.outcome(0.5, 0.0) for peer in peers]
                assert [(o.goaway, o.closed) for o in outcomes] == [
                    (None, False),
                    (None, False),
                    (f.ENHANCE_YOUR_CALM, True),
                ]
                assert await normal_call(channel) == b"re:hello"
            finally:
                for peer in peers:
                    peer.close()

    asyncio.run(scenario())


def test_a_tls_handshake_never_begun_is_dropped_after_the_preface_timeout() -> None:
    """A peer that opens TCP and never says hello holds a connection slot for asyncio's own default
    handshake timeout (60 s) unless the server sets its own: the preface timeout (0.5 s here)."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with attacked(tls=True) as (port, channel, _):
            began = loop.time()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                with contextlib.suppress(ConnectionResetError):
                    assert await asyncio.wait_for(reader.read(), 10.0) == b""
            finally:
                writer.close()
            assert loop.time() - began < 5.0
            assert await normal_call(channel) == b"re:hello"

    asyncio.run(scenario())
