"""Plays Envoy's side of one ext_proc stream, for tests and `harness replay` (no Envoy needed).

Envoy in BUFFERED mode sends a message and waits for its reply before sending the next; this client
does the same, so the EPP sees exactly the sequence it sees in production. Messages are the real
`xds-protos` ProcessingRequest objects. Synchronous (a thread-safe request queue feeds grpc's
iterator) so sync tests can call it while the EPP runs on its own event loop.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import json_format

DESTINATION_HEADER = "x-gateway-destination-endpoint"
_END = object()


@dataclass
class ExtProcResult:
    """What the EPP told Envoy for one request."""

    status: int  # 200 when routed, else the ImmediateResponse status
    endpoint: str | None = None  # from dynamic metadata envoy.lb
    header_endpoint: str | None = None  # from the set_headers mutation
    set_headers: dict[str, str] = field(default_factory=dict)
    removed_headers: list[str] = field(default_factory=list)
    body: bytes | None = None  # the mutated request body, if the EPP rewrote it
    message: str = ""  # the ImmediateResponse's readable message (error.message of its JSON body)
    error_body: str = ""  # the ImmediateResponse body as sent
    metadata: dict[str, Any] = field(default_factory=dict)
    responses: list[pb.ProcessingResponse] = field(default_factory=list)


def headers_message(
    headers: Mapping[str, str], end_of_stream: bool = False, *, response: bool = False
) -> pb.ProcessingRequest:
    hmap = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )
    msg = pb.HttpHeaders(headers=hmap, end_of_stream=end_of_stream)
    return (
        pb.ProcessingRequest(response_headers=msg) if response else pb.ProcessingRequest(request_headers=msg)
    )


def body_message(chunk: bytes, end_of_stream: bool, *, response: bool = False) -> pb.ProcessingRequest:
    msg = pb.HttpBody(body=chunk, end_of_stream=end_of_stream)
    return pb.ProcessingRequest(response_body=msg) if response else pb.ProcessingRequest(request_body=msg)


def request_headers(path: str = "/v1/completions", method: str = "POST", **extra: str) -> dict[str, str]:
    headers = {
        ":method": method,
        ":path": path,
        ":authority": "gateway.test",
        ":scheme": "http",
        "content-type": "application/json",
        "user-agent": "harness-extproc-client",
    }
    headers.update({k.replace("_", "-"): v for k, v in extra.items()})
    return headers


class ExtProcClient:
    """A channel to one EPP; `route()` runs a whole request stream and summarises the answers."""

    def __init__(self, target: str, *, tls: bool = False, timeout: float = 10.0) -> None:
        if tls:
            # Trust whatever certificate the EPP presents, for this channel only: a test tool talking
            # to a known local EPP. Envoy, in contrast, verifies it (harness.dataplane.envoy.ExtProcTls).
            import ssl

            host, port = target.rsplit(":", 1)
            pem = ssl.get_server_certificate((host, int(port)))
            creds = grpc.ssl_channel_credentials(root_certificates=pem.encode())
            self._channel = grpc.secure_channel(
                target, creds, options=[("grpc.ssl_target_name_override", _cert_name(pem))]
            )
        else:
            self._channel = grpc.insecure_channel(target)
        self._stub = pb_grpc.ExternalProcessorStub(self._channel)
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ExtProcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exchange(self, messages: Sequence[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
        """Send each message after the previous reply; stop early on an ImmediateResponse.

        Then half-close the stream, as Envoy does when the HTTP stream is done, and read until the
        EPP ends it: the EPP releases what the stream held (the request's in-flight count on its pod)
        before it ends the stream, so when this returns that release has happened. A cancel instead
        let the next request be scheduled while the last one still counted in flight on its pod
        (a routing test then saw its lightly loaded pod lose to a busier one).
        """
        outbox: queue.Queue[object] = queue.Queue()

        def requests() -> Iterator[pb.ProcessingRequest]:
            while (item := outbox.get()) is not _END:
                assert isinstance(item, pb.ProcessingRequest)
                yield item

        replies: list[pb.ProcessingResponse] = []
        pending = list(messages)
        outbox.put(pending.pop(0))
        call = self._stub.Process(requests(), timeout=self._timeout)
        try:
            for reply in call:
                replies.append(reply)
                if reply.HasField("immediate_response") or not pending:
                    break
                outbox.put(pending.pop(0))
            outbox.put(_END)
            replies.extend(call)  # nothing more is expected; ends when the EPP ends the stream
        finally:
            outbox.put(_END)
            call.cancel()
        return replies

    def route(
        self,
        body: bytes | Mapping[str, Any] | None,
        *,
        headers: Mapping[str, str] | None = None,
        chunks: int = 1,
    ) -> ExtProcResult:
        """One request: headers, then the body (optionally split into `chunks` messages)."""
        raw = json.dumps(body).encode() if isinstance(body, Mapping) else body
        hdrs = dict(headers) if headers is not None else request_headers()
        messages = [headers_message(hdrs, end_of_stream=raw is None)]
        if raw is not None:
            step = max(1, -(-len(raw) // chunks))
            parts = [raw[i : i + step] for i in range(0, len(raw), step)] or [b""]
            messages += [body_message(p, end_of_stream=i == len(parts) - 1) for i, p in enumerate(parts)]
        return summarise(self.exchange(messages))

    def round_trip(
        self,
        body: bytes,
        response_headers: Mapping[str, str],
        response_chunks: Sequence[bytes],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> ExtProcResult:
        """A request and then its response, as Envoy streams both through the processor.

        The request part is summarised as by `route` (the response side never changes anything);
        if the EPP rejects the request the exchange stops there, as it would in Envoy.
        """
        chunks = list(response_chunks) or [b""]
        messages = [
            headers_message(dict(headers) if headers is not None else request_headers()),
            body_message(body, end_of_stream=True),
            headers_message(response_headers, response=True),
        ]
        messages += [
            body_message(c, end_of_stream=i == len(chunks) - 1, response=True) for i, c in enumerate(chunks)
        ]
        return summarise(self.exchange(messages))


def _cert_name(pem: str) -> str:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem.encode())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = san.get_values_for_type(x509.DNSName)
        if names:
            return str(names[0])
    except x509.ExtensionNotFound:
        pass
    return str(cert.subject.rfc4514_string().split("CN=")[-1].split(",")[0])


def _error_message(text: str) -> str:
    """The EPP answers errors with OpenAI-style JSON; fall back to the raw text for anything else."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text


def summarise(replies: Sequence[pb.ProcessingResponse]) -> ExtProcResult:
    result = ExtProcResult(status=200, responses=list(replies))
    for reply in replies:
        if reply.HasField("immediate_response"):
            imm = reply.immediate_response
            result.status = int(imm.status.code)
            result.error_body = bytes(imm.body).decode(errors="replace")
            result.message = _error_message(result.error_body)
            return result
        which = reply.WhichOneof("response")
        common = getattr(reply, which).response if which in ("request_headers", "request_body") else None
        if common is not None:
            for opt in common.header_mutation.set_headers:
                value = opt.header.raw_value.decode() if opt.header.raw_value else opt.header.value
                result.set_headers[opt.header.key.lower()] = value
            result.removed_headers += list(common.header_mutation.remove_headers)
            if common.body_mutation.HasField("body"):
                result.body = common.body_mutation.body
        if reply.HasField("dynamic_metadata"):
            result.metadata = json_format.MessageToDict(reply.dynamic_metadata)
    result.header_endpoint = result.set_headers.get(DESTINATION_HEADER)
    lb = result.metadata.get("envoy.lb")
    result.endpoint = lb.get(DESTINATION_HEADER) if isinstance(lb, dict) else None
    return result
