"""`epp.h2.GrpcServer` on real sockets, driven by grpcio's own client (C-core): TLS with ALPN, many
calls, graceful stop, and the port it will not share."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from epp.h2 import GrpcServer
from epp.h2 import frames as f
from epp.server.tls import self_signed, ssl_context

from .support import PATH, Recorder, Script, goaway_code


@asynccontextmanager
async def serving(
    recorder: Recorder, script: Script | None = None, *, tls: bool = False
) -> AsyncIterator[tuple[GrpcServer, grpc.aio.Channel]]:
    pair = self_signed() if tls else None
    server = GrpcServer(ssl_context=ssl_context(pair) if pair is not None else None)
    server.add_method(PATH, recorder.factory(script or Script()))
    port = await server.start("127.0.0.1", 0)
    if pair is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=pair.cert_pem)
        options = (("grpc.ssl_target_name_override", "localhost"),)
        channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options)
    else:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield server, channel
    finally:
        await channel.close()
        await server.stop(None)


async def chat(channel: grpc.aio.Channel, *messages: bytes) -> tuple[list[bytes], grpc.StatusCode]:
    call = channel.stream_stream(PATH)()
    replies = []
    try:
        for message in messages:
            await call.write(message)
            replies.append(await call.read())
        await call.done_writing()
    except grpc.aio.AioRpcError as exc:
        return replies, exc.code()
    return replies, await call.code()


async def call_answered_once(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
    """A call left open after its first message was answered."""
    call = channel.stream_stream(PATH)()
    await call.write(b"first")
    assert await call.read() == b"re:first"
    return call


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "cleartext"])
def test_grpcio_client_calls_are_served(tls: bool) -> None:
    async def scenario() -> None:
        recorder = Recorder()
        async with serving(recorder, tls=tls) as (_, channel):
            results = await asyncio.gather(*(chat(channel, b"a%d" % i, b"b%d" % i) for i in range(20)))
        assert sorted(results) == sorted(
            ([b"re:a%d" % i, b"re:b%d" % i], grpc.StatusCode.OK) for i in range(20)
        )
        assert [h.closed for h in recorder.handlers] == [1] * 20

    asyncio.run(scenario())


def test_stop_lets_open_calls_finish_within_the_grace_and_refuses_new_ones() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        async with serving(recorder) as (server, channel):
            call = await call_answered_once(channel)
            began = time.monotonic()
            stopping = asyncio.create_task(server.stop(30.0))
            await asyncio.sleep(0.1)
            late = await chat(channel, b"late")
            assert late[1] == grpc.StatusCode.UNAVAILABLE
            await call.write(b"second")
            assert await call.read() == b"re:second"
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
            await stopping
            assert time.monotonic() - began < 10  # it did not wait out the grace
        assert [h.messages for h in recorder.handlers] == [[b"first", b"second"]]
        assert recorder.handlers[0].closed == 1

    asyncio.run(scenario())


def test_stop_ends_calls_still_open_after_the_grace() -> None:
    async def scenario() -> None:
        recorder = Recorder()
        async with serving(recorder) as (server, channel):
            call = await call_answered_once(channel)
            await server.stop(0.2)
            # stop returns once every connection is closed and every handler with it
            assert (server.connection_count, recorder.handlers[0].closed) == (0, 1)
            assert await call.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert recorder.handlers[0].closed == 1

    asyncio.run(scenario())


def test_a_second_server_cannot_take_the_same_port() -> None:
    async def scenario() -> None:
        first, second = GrpcServer(), GrpcServer()
        port = await first.start("127.0.0.1", 0)
        try:
            with pytest.raises(OSError, match="in use"):
                await second.start("127.0.0.1", port)
        finally:
            await first.stop(None)
            await second.stop(None)

    asyncio.run(scenario())


def test_a_restarted_server_takes_its_port_back_while_closed_connections_linger() -> None:
    """The server closes its connections first when it stops, so their ends wait in TIME_WAIT on
    its port; an EPP restarted at once must still bind it (SO_REUSEADDR)."""

    async def scenario() -> None:
        first = GrpcServer()
        port = await first.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await first.stop(None)  # closes the connection from the server's side
        await asyncio.wait_for(reader.read(), 10.0)  # its SETTINGS and GOAWAY, then the end
        assert reader.at_eof()
        writer.close()
        await writer.wait_closed()
        second = GrpcServer()
        try:
            assert await second.start("127.0.0.1", port) == port
        finally:
            await second.stop(None)

    asyncio.run(scenario())


@pytest.mark.parametrize("beside_a_graceful_stop", [False, True], ids=["alone", "beside-a-graceful-stop"])
def test_a_hurried_stop_ends_open_calls_at_once(beside_a_graceful_stop: bool) -> None:
    async def scenario() -> None:
        recorder = Recorder()
        async with serving(recorder) as (server, channel):
            call = await call_answered_once(channel)
            graceful = asyncio.create_task(server.stop(60.0)) if beside_a_graceful_stop else None
            await asyncio.sleep(0)
            await asyncio.wait_for(server.stop(None), 10.0)
            assert recorder.handlers[0].closed == 1
            assert await call.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
            if graceful is not None:
                await asyncio.wait_for(graceful, 10.0)  # nothing left for it to wait for

    asyncio.run(scenario())


def test_a_tls_connection_whose_handshake_ends_during_a_stop_is_refused() -> None:
    """Accepted before the stop, its handshake finished after: it gets GOAWAY NO_ERROR and is closed,
    never served (the stop would not wait for, or close, a connection it did not know of)."""

    async def scenario() -> None:
        pair = self_signed()
        server = GrpcServer(ssl_context=ssl_context(pair))
        server.add_method(PATH, Recorder().factory(Script()))
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client_tls = ssl.create_default_context(cadata=pair.cert_pem.decode())
        client_tls.set_alpn_protocols(["h2"])
        client_tls.check_hostname = False
        stopping = asyncio.create_task(server.stop(30.0))
        await asyncio.sleep(0.1)
        await writer.start_tls(client_tls)
        writer.write(f.PREFACE + f.frame(f.SETTINGS, 0, 0))
        received = await asyncio.wait_for(reader.read(), 10.0)  # read to the end: it is closed
        writer.close()
        assert goaway_code(received) == f.NO_ERROR
        await asyncio.wait_for(stopping, 10.0)

    asyncio.run(scenario())
