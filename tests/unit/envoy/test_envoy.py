"""A real Envoy with the generated bootstrap, two simulators and a tiny fake ext_proc service (no EPP).

The fake answers every request body with dynamic metadata ``envoy.lb`` →
``x-gateway-destination-endpoint: <the second simulator>``, as the EPP does, in the mode Envoy says
it uses: BUFFERED (a reply per message) or FULL_DUPLEX_STREAMED (nothing until the body has ended,
then the headers reply with the destination and the body handed back). Envoy's start and stop block
the event loop briefly; nothing on the loop needs to run meanwhile.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from harness.base.addresses import AddressPool
from harness.base.binaries import envoy_path
from harness.base.eventually import eventually_async
from harness.base.ports import reserve_port
from harness.base.process import ProcessStartError
from harness.cluster.certs import TinyCA
from harness.dataplane.envoy import (
    DESTINATION_HEADER,
    Envoy,
    EnvoyOptions,
    ExtProcTls,
    bootstrap_json,
    build_bootstrap,
)
from harness.sim import SERVED_BY_HEADER, ModelServerSim, SimConfig

pytestmark = pytest.mark.anyio

SIM_CONFIG = SimConfig(model="base", time_scale=0.001)
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
MODES = ["FULL_DUPLEX_STREAMED", "BUFFERED"]
TWO_MIB = 2 * 1024 * 1024
GRPC_MAX_MESSAGE = 32 * 1024 * 1024  # the EPP raises grpcio's 4 MiB default the same way


class FakePicker(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Routes every request to one fixed destination via dynamic metadata; records what it saw."""

    def __init__(self) -> None:
        self.destination = ""  # host:port, set once the target simulator listens
        self.streams = 0
        self.request_body_sizes: list[int] = []  # one per request: the whole body
        self.response_body_chunks = 0
        self.request_body_modes: list[str] = []  # one per stream: the mode Envoy said it uses

    async def Process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        self.streams += 1
        duplex = False
        body = b""
        async for request in requests:
            if request.HasField("protocol_config"):
                mode = request.protocol_config.request_body_mode
                duplex = mode == FULL_DUPLEX
                self.request_body_modes.append(processing_mode_pb2.ProcessingMode.BodySendMode.Name(mode))
            kind = request.WhichOneof("request")
            metadata = struct_pb2.Struct()
            metadata.update({"envoy.lb": {DESTINATION_HEADER: self.destination}})
            if kind == "request_headers" and not duplex:
                yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "request_body" and not duplex:
                self.request_body_sizes.append(len(request.request_body.body))
                yield pb.ProcessingResponse(request_body=pb.BodyResponse(), dynamic_metadata=metadata)
            elif kind == "request_body":
                body += request.request_body.body
                if request.request_body.end_of_stream:
                    self.request_body_sizes.append(len(body))
                    yield pb.ProcessingResponse(
                        request_headers=pb.HeadersResponse(), dynamic_metadata=metadata
                    )
                    for start in range(0, len(body), 65536):
                        chunk = pb.StreamedBodyResponse(
                            body=body[start : start + 65536], end_of_stream=start + 65536 >= len(body)
                        )
                        mutation = pb.BodyMutation(streamed_response=chunk)
                        yield pb.ProcessingResponse(
                            request_body=pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
                        )
            elif kind == "response_body":
                self.response_body_chunks += 1
                yield pb.ProcessingResponse(response_body=pb.BodyResponse())
            elif kind == "response_trailers":
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
            elif kind != "request_headers":
                raise AssertionError(f"unexpected ext_proc message {kind}")


# The name Envoy expects on the picker's certificate (a Service DNS name, as in a cluster).
PICKER_NAME = "epp.harness-test.svc"


@contextlib.asynccontextmanager
async def fake_ext_proc(
    picker: FakePicker, *, issuer: TinyCA | None = None, names: tuple[str, ...] = (PICKER_NAME,)
) -> AsyncIterator[tuple[str, ExtProcTls]]:
    """The picker on grpc.aio over TLS at 127.0.0.1:<free port>, and what Envoy must trust.

    The certificate comes from a throw-away CA, for `names`; Envoy is told to trust that CA and to
    expect PICKER_NAME. `issuer` signs with another CA instead (a certificate Envoy must refuse).
    """
    ca = TinyCA()
    pair = (issuer or ca).issue_serving(dns_names=list(names), ips=[])
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(pair.key_pem, pair.cert_pem)]))
    await server.start()
    try:
        yield f"127.0.0.1:{port}", ExtProcTls(ca_pem=ca.cert_pem, server_name=PICKER_NAME)
    finally:
        await server.stop(grace=None)


@pytest.fixture
def pool() -> Iterator[AddressPool]:
    with AddressPool() as addresses:
        yield addresses


@contextlib.asynccontextmanager
async def two_sims(pool: AddressPool) -> AsyncIterator[tuple[ModelServerSim, ModelServerSim]]:
    async with (
        ModelServerSim(pool.acquire(), config=SIM_CONFIG) as decoy,
        ModelServerSim(pool.acquire(), config=SIM_CONFIG) as target,
    ):
        yield decoy, target


async def complete(
    http: aiohttp.ClientSession, envoy: Envoy, prompt: str = "hello", headers: dict[str, str] | None = None
) -> tuple[int, str | None, Any]:
    # A file-like body: aiohttp warns about multi-MiB bytes bodies.
    body = io.BytesIO(json.dumps({"model": "base", "prompt": prompt, "max_tokens": 3}).encode())
    headers = {"Content-Type": "application/json", **(headers or {})}
    async with http.post(f"{envoy.base_url}/v1/completions", data=body, headers=headers) as response:
        text = await response.text()
        return response.status, response.headers.get(SERVED_BY_HEADER), text


@pytest.mark.parametrize("request_mode", MODES)
@pytest.mark.parametrize("mode", ["NONE", "STREAMED"])
def test_envoy_accepts_the_bootstrap(tmp_path: Path, mode: str, request_mode: str) -> None:
    bootstrap = build_bootstrap(
        listener_port=18080,
        admin_port=19901,
        ext_proc_host="127.0.0.1",
        ext_proc_port=9002,
        access_log_path=tmp_path / "access.log",
        options=EnvoyOptions(response_body_mode=mode, request_body_mode=request_mode),  # type: ignore[arg-type]
        ext_proc_tls=ExtProcTls(ca_pem=TinyCA().cert_pem, server_name=PICKER_NAME),
    )
    config = tmp_path / "bootstrap.json"
    config.write_text(bootstrap_json(bootstrap))
    with reserve_port() as base_id:  # validate mode still claims hot-restart resources
        result = subprocess.run(
            [str(envoy_path()), "--mode", "validate", "-c", str(config), "--base-id", str(base_id.port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    clusters = {c["name"]: c for c in json.loads(config.read_text())["staticResources"]["clusters"]}
    assert clusters["model_servers"]["originalDstLbConfig"] == {
        "metadataKey": {"key": "envoy.lb", "path": [{"key": DESTINATION_HEADER}]}
    }
    assert "useHttpHeader" not in clusters["model_servers"]["originalDstLbConfig"]
    validation = clusters["ext_proc"]["transportSocket"]["typedConfig"]["commonTlsContext"][
        "validationContext"
    ]
    assert "trustedCa" in validation
    assert validation["matchTypedSubjectAltNames"] == [{"sanType": "DNS", "matcher": {"exact": PICKER_NAME}}]


@pytest.mark.parametrize("request_mode", MODES)
async def test_routes_by_metadata_and_ignores_a_client_destination_header(
    pool: AddressPool, request_mode: str
) -> None:
    picker = FakePicker()
    async with two_sims(pool) as (decoy, target), fake_ext_proc(picker) as (ext_proc, trust):
        picker.destination = target.address
        options = EnvoyOptions(request_body_mode=request_mode)  # type: ignore[arg-type]
        with Envoy(ext_proc, options=options, ext_proc_tls=trust) as envoy:
            async with aiohttp.ClientSession() as http:
                steer = {DESTINATION_HEADER: decoy.address}
                status, served_by, _ = await complete(http, envoy, headers=steer)
                assert (status, served_by) == (200, target.address)
                status, served_by, _ = await complete(http, envoy)
                assert (status, served_by) == (200, target.address)
            assert decoy.requests_by_model == {}
            assert target.requests_by_model == {"base": 2}
            assert picker.request_body_modes == [request_mode] * 2, "Envoy streams in the mode it was given"

            async def logged() -> None:
                entries = envoy.access_log()
                assert len(entries) == 2
                assert {e["upstream_host"] for e in entries} == {target.address}
                assert {e["destination_metadata"] for e in entries} == {target.address}

            await eventually_async(logged)


async def test_a_two_mib_prompt_is_buffered_and_routed(pool: AddressPool) -> None:
    picker = FakePicker()
    async with two_sims(pool) as (_, target), fake_ext_proc(picker) as (ext_proc, trust):
        picker.destination = target.address
        with Envoy(ext_proc, ext_proc_tls=trust) as envoy:
            async with aiohttp.ClientSession() as http:
                status, served_by, text = await complete(http, envoy, prompt="x" * TWO_MIB)
    assert (status, served_by) == (200, target.address), text
    assert picker.request_body_sizes
    assert picker.request_body_sizes[0] > TWO_MIB
    assert json.loads(text)["usage"]["prompt_tokens"] == TWO_MIB // 4


async def test_streamed_response_mode_passes_sse_through_the_processor(pool: AddressPool) -> None:
    picker = FakePicker()
    async with two_sims(pool) as (_, target), fake_ext_proc(picker) as (ext_proc, trust):
        picker.destination = target.address
        with Envoy(
            ext_proc, options=EnvoyOptions(response_body_mode="STREAMED"), ext_proc_tls=trust
        ) as envoy:
            body = {"model": "base", "prompt": "hi", "max_tokens": 3, "stream": True}
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{envoy.base_url}/v1/completions", json=body) as response,
            ):
                assert response.status == 200
                assert response.headers[SERVED_BY_HEADER] == target.address
                raw = (await response.read()).decode()
    assert raw.rstrip().endswith("data: [DONE]")
    assert picker.response_body_chunks >= 1


async def test_fails_closed_when_ext_proc_is_down(pool: AddressPool) -> None:
    async with two_sims(pool) as (decoy, target):
        trust = ExtProcTls(ca_pem=TinyCA().cert_pem, server_name=PICKER_NAME)
        with (
            reserve_port() as nobody_listens,
            Envoy(f"127.0.0.1:{nobody_listens.port}", ext_proc_tls=trust) as envoy,
        ):
            async with aiohttp.ClientSession() as http:
                status, _, _ = await complete(http, envoy, headers={DESTINATION_HEADER: decoy.address})
        assert 500 <= status < 600
        assert decoy.requests_by_model == {}
        assert target.requests_by_model == {}


def test_start_failure_raises_with_the_log_tail() -> None:
    with reserve_port() as port:
        trust = ExtProcTls(ca_pem=TinyCA().cert_pem, server_name=PICKER_NAME)
        envoy = Envoy("127.0.0.1:9", port=port.port, admin_port=port.port, ext_proc_tls=trust)  # cannot bind
        with pytest.raises(ProcessStartError, match="exited during start") as info:
            envoy.start()
    assert "Address already in use" in info.value.log_tail or "cannot bind" in info.value.log_tail
    assert not envoy.running


@pytest.mark.parametrize(
    ("other_ca", "names"),
    [
        pytest.param(True, (PICKER_NAME,), id="certificate-from-another-ca"),
        pytest.param(False, ("someone-else.harness-test.svc",), id="certificate-for-another-name"),
    ],
)
async def test_envoy_refuses_an_ext_proc_server_it_cannot_verify(
    pool: AddressPool, other_ca: bool, names: tuple[str, ...]
) -> None:
    """TLS to the EPP once encrypted without verifying: anyone answering on its address could route."""
    picker = FakePicker()
    issuer = TinyCA() if other_ca else None
    async with (
        two_sims(pool) as (decoy, target),
        fake_ext_proc(picker, issuer=issuer, names=names) as (
            ext_proc,
            trust,
        ),
    ):
        picker.destination = target.address
        with Envoy(ext_proc, ext_proc_tls=trust) as envoy:
            async with aiohttp.ClientSession() as http:
                status, _, text = await complete(http, envoy)
    assert 500 <= status < 600, text
    assert picker.streams == 0
    assert decoy.requests_by_model == target.requests_by_model == {}


# Headers a client might send to steer Envoy itself; none may be honoured or reach the model server.
CLIENT_ENVOY_HEADERS = {
    "x-envoy-upstream-rq-timeout-ms": "1",
    "x-envoy-retry-on": "5xx,reset",
    "x-envoy-max-retries": "7",
    "x-envoy-original-dst-host": "192.0.2.1:8000",
    "x-envoy-internal": "true",
    "x-envoy-decorator-operation": "client-chosen",
    "x-envoy-attempt-count": "9",
    "x-envoy-made-up": "anything",
}


async def test_client_envoy_headers_are_not_trusted(pool: AddressPool) -> None:
    picker = FakePicker()
    async with two_sims(pool) as (_, target), fake_ext_proc(picker) as (ext_proc, trust):
        picker.destination = target.address
        with Envoy(ext_proc, ext_proc_tls=trust) as envoy:
            async with aiohttp.ClientSession() as http:
                status, served_by, text = await complete(http, envoy, headers=CLIENT_ENVOY_HEADERS)
    assert (status, served_by) == (200, target.address), text
    [received] = target.received_requests()
    client_sent = {(name, value) for name, value in CLIENT_ENVOY_HEADERS.items()}
    assert client_sent & set(received.headers) == set()
    assert [name for name, _ in received.headers if name in CLIENT_ENVOY_HEADERS] == []
    # The route's timeout, not the client's 1 ms, is what Envoy applied (and says it applied).
    assert received.header_values("x-envoy-expected-rq-timeout-ms") == ["600000"]
