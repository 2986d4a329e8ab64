"""`EnvoyOptions.lwepp()`: plain Envoy set up for the ext_proc replies of GIE v1.6.0's lwepp.

The fake processor here answers as lwepp's `handlers/server.go` does: nothing to request headers
that do not end the stream; a plain CONTINUE to every body chunk; the headers reply (destination
header and `envoy.lb` metadata) only on the chunk that ends the body, just before that chunk's
CONTINUE. In upstream's v1 mode Envoy refuses that (`spurious_message`, 502) because the body
comes in pieces and full duplex wants the body echoed; with the body buffered whole and STREAMED
without waiting for the headers' reply, the request reaches the picked pod.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from epp.h2 import GrpcServer, Replies
from epp.handlers.servicer import METHOD_PATH
from harness.base.addresses import AddressPool
from harness.dataplane.envoy import DESTINATION_HEADER, DESTINATION_NAMESPACE, Envoy, EnvoyOptions
from harness.sim import SERVED_BY_HEADER, ModelServerSim, SimConfig

pytestmark = pytest.mark.anyio


class LweppLikeStream:
    """One ext_proc stream answered with lwepp's reply pattern, always picking `target`
    (an `epp.h2.GrpcStream`: serialized messages in, serialized replies out)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.deferred = False

    def _headers_reply(self) -> bytes:
        reply = pb.ProcessingResponse()
        common = reply.request_headers.response
        common.clear_route_cache = True
        header = common.header_mutation.set_headers.add()
        header.header.key = DESTINATION_HEADER
        header.header.raw_value = self.target.encode()
        metadata = struct_pb2.Struct()
        metadata.update({DESTINATION_NAMESPACE: {DESTINATION_HEADER: self.target}})
        reply.dynamic_metadata.CopyFrom(metadata)
        return reply.SerializeToString()

    async def handle(self, message: bytes) -> tuple[Replies, bool]:
        request = pb.ProcessingRequest.FromString(message)
        kind = request.WhichOneof("request")
        if kind == "request_headers":
            if request.request_headers.end_of_stream:
                return self._headers_reply(), False
            self.deferred = True
            return None, False
        if kind == "request_body":
            body_continue = pb.ProcessingResponse()
            body_continue.request_body.response.SetInParent()
            if request.request_body.end_of_stream and self.deferred:
                return (self._headers_reply(), body_continue.SerializeToString()), False
            return body_continue.SerializeToString(), False
        return None, False  # lwepp ignores trailers; the response side is not sent in either mode

    def close(self) -> None:
        pass


@pytest.fixture
def address() -> Iterator[str]:
    with AddressPool() as pool:
        yield pool.acquire()


@pytest.mark.parametrize(
    ("options", "status"),
    [
        pytest.param(EnvoyOptions.lwepp(ext_proc_tls=False), 200, id="lwepp-mode"),
        pytest.param(EnvoyOptions.v1(ext_proc_tls=False, follow_pool_endpoints=False), 502, id="v1-mode"),
    ],
)
async def test_lwepps_replies_route_only_in_its_own_mode(
    address: str, options: EnvoyOptions, status: int
) -> None:
    async with ModelServerSim(address, 0, SimConfig(model="base", time_scale=0.001)) as sim:
        server = GrpcServer()
        server.add_method(METHOD_PATH, lambda: LweppLikeStream(sim.address))
        port = await server.start("127.0.0.1", 0)
        try:
            with Envoy(f"127.0.0.1:{port}", options=options) as envoy:
                async with aiohttp.ClientSession() as http:
                    body = {"model": "base", "prompt": "hi lwepp", "max_tokens": 1}
                    async with http.post(f"{envoy.base_url}/v1/completions", json=body) as response:
                        assert response.status == status, await response.text()
                        if status == 200:
                            assert response.headers[SERVED_BY_HEADER] == sim.address
                        else:
                            assert "spurious_message" in await response.text()
        finally:
            await server.stop(None)
