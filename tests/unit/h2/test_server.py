"""`epp.h2.GrpcServer` on real sockets, driven by grpcio's own client (C-core): TLS with ALPN, many
calls, graceful stop, and the port it will not share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from epp.h2 import GrpcServer
from epp.server.tls import self_signed, ssl_context

from .support import PATH, Recorder, Script


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
            call = channel.stream_stream(PATH)()
            await call.write(b"first")
            assert await call.read() == b"re:first"
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
            call = channel.stream_stream(PATH)()
            await call.write(b"first")
            assert await call.read() == b"re:first"
            await server.stop(0.2)
            assert await call.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
            assert server.connection_count == 0
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
