"""`Epp.drain()`, what SIGTERM does: NOT_SERVING first, keep serving for the shutdown delay, then
refuse new ext_proc streams while those in flight finish; a second stop request cuts it short.

With Envoy in front (two replicas, health-checked), this is what makes a SIGTERM cost no request:
tests/e2e/test_epp_faults.py and benchmarks/bench_epp_faults.py show it through a real Envoy.
"""

from __future__ import annotations

import asyncio
import gc
from dataclasses import replace

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.server.runner import Epp
from epp.server.supervisor import TaskFailed
from harness.base.eventually import eventually_async

from .support import LOOPBACK_CONFIG, make_epp

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
BODY = pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"model":"food-review"}', end_of_stream=True))
WAIT_S = 10.0


async def health(epp: Epp) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.health_port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        return int(reply.status)


class Stream:
    """One ext_proc stream as Envoy holds it: routed, then open until the response has ended."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = pb_grpc.ExternalProcessorStub(channel).Process()

    async def route(self) -> str:
        await self.call.write(pb.ProcessingRequest(request_headers=pb.HttpHeaders()))
        await self.call.read()
        await self.call.write(BODY)
        reply = await self.call.read()
        assert isinstance(reply, pb.ProcessingResponse)
        fields = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
        return str(fields["x-gateway-destination-endpoint"].string_value)

    async def finish(self) -> grpc.StatusCode:
        await self.call.done_writing()
        code: grpc.StatusCode = await self.call.code()
        return code


async def routes_on_a_new_stream(epp: Epp) -> str:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.grpc_port}") as channel:
        stream = Stream(channel)
        endpoint = await stream.route()
        assert await stream.finish() == grpc.StatusCode.OK
        return endpoint


def test_drain_says_not_serving_first_then_refuses_new_streams_while_open_ones_finish() -> None:
    config = replace(LOOPBACK_CONFIG, shutdown_delay=1.0, shutdown_grace_period=WAIT_S)

    async def scenario() -> None:
        async with make_epp(config=config) as epp:

            async def not_serving() -> None:
                assert await health(epp) == NOT_SERVING

            await epp.wait_ready()
            assert await health(epp) == SERVING
            async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.grpc_port}") as channel:
                in_flight = Stream(channel)
                assert await in_flight.route() == "10.0.0.1:8000"

                draining = asyncio.create_task(epp.drain())
                await eventually_async(not_serving, timeout=WAIT_S)
                # During the delay the replica still routes: load balancers have not noticed yet.
                assert not draining.done()
                assert await routes_on_a_new_stream(epp) == "10.0.0.1:8000"

                async def refused() -> None:
                    code = grpc.StatusCode.OK
                    try:
                        await asyncio.wait_for(routes_on_a_new_stream(epp), 2.0)
                    except grpc.aio.AioRpcError as err:
                        code = err.code()
                    assert code == grpc.StatusCode.UNAVAILABLE, "a new stream was still accepted"

                await eventually_async(refused, timeout=WAIT_S)
                # The stream opened before the drain is still open, and the drain waits for it.
                await asyncio.sleep(0.2)
                assert not draining.done(), "the drain did not wait for the stream in flight"
                assert await in_flight.finish() == grpc.StatusCode.OK
                await asyncio.wait_for(draining, WAIT_S)
            assert epp.draining

    asyncio.run(scenario())
    # The refused streams' errors sit in reference cycles (error -> traceback -> frame -> task) that
    # keep a grpc call, and with it grpc's poller thread, alive until the collector runs.
    gc.collect()


def test_a_second_stop_request_ends_the_drain_at_once() -> None:
    config = replace(LOOPBACK_CONFIG, shutdown_delay=600.0, shutdown_grace_period=600.0)

    async def scenario() -> None:
        async with make_epp(config=config) as epp:

            async def not_serving() -> None:
                assert await health(epp) == NOT_SERVING

            await epp.wait_ready()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.grpc_port}") as channel:
                in_flight = Stream(channel)
                await in_flight.route()
                epp.request_stop()
                draining = asyncio.create_task(epp.drain())
                await eventually_async(not_serving, timeout=WAIT_S)

                epp.request_stop()  # the second SIGTERM / Ctrl-C

                await asyncio.wait_for(draining, WAIT_S)  # not the 600 s delay, nor the 600 s grace
                assert await in_flight.call.code() != grpc.StatusCode.OK

    asyncio.run(scenario())


def test_a_task_failing_during_the_drain_ends_it_and_is_surfaced() -> None:
    config = replace(LOOPBACK_CONFIG, shutdown_delay=600.0)

    async def scenario() -> None:
        async with make_epp(config=config, fail=RuntimeError("watch exploded")) as epp:
            with pytest.raises(TaskFailed, match="watch exploded"):
                await asyncio.wait_for(epp.drain(), WAIT_S)  # not the 600 s delay

    asyncio.run(scenario())
