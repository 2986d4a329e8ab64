"""Reading a running EPP from outside, the way operators and probes do: its HTTP ports and gRPC health.

Shared by the in-process EPP (integration tests) and the EPP process (e2e, demo), so both are
observed through exactly the same doors.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.request
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEBUG_DATASTORE_PATH = "/debug/datastore"


def datastore_view(debug_url: str, timeout: float = 5.0) -> dict[str, Any]:
    """The read-only JSON view of the datastore (pool, models, pods with metrics and their age).

    `debug_url` is the base URL of the EPP's debug listener (`--debugPort`, loopback by default).
    """
    with urllib.request.urlopen(f"{debug_url}{DEBUG_DATASTORE_PATH}", timeout=timeout) as resp:
        view: dict[str, Any] = json.load(resp)
        return view


def metrics_text(metrics_url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=timeout) as resp:
        return str(resp.read().decode())


def health(address: str, service: str = "", timeout: float = 5.0) -> str:
    """SERVING / NOT_SERVING, as a kubelet gRPC probe would see it."""
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def tls_handshake(address: str, ca_pem: bytes, server_name: str, timeout: float = 2.0) -> None:
    """Complete a TLS handshake with the ext_proc port as Envoy does (CA, name, ALPN h2), or raise.

    An empty ``ca_pem`` verifies nothing (as Envoy with ``UNVERIFIED_EXT_PROC_TLS``).

    gRPC health can say SERVING before the ext_proc listener exists (upstream's EPP reports it while
    still generating its key), so "ready for Envoy" needs this too. Raises ``OSError`` (including
    ``ssl.SSLError``) while the port is not serving TLS with a certificate for ``server_name``.
    """
    host, _, port = address.rpartition(":")
    if ca_pem:
        context = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    else:  # an EPP with a self-signed certificate of its own (lwepp): TLS and ALPN, nothing verified
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname=server_name or None) as tls,
    ):
        if tls.selected_alpn_protocol() != "h2":
            raise ssl.SSLError(
                f"{address} does not speak HTTP/2 over TLS (ALPN {tls.selected_alpn_protocol()!r})"
            )
