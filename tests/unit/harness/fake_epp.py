"""A stand-in EPP for the launcher's tests: ``python fake_epp.py --mode=MODE <upstream flags>``.

Modes: ``good`` (health SERVING, ext_proc TLS with the ``--certPath`` certificate and ALPN h2),
``health-only`` (health SERVING, nothing on the ext_proc port: upstream's start-up gap, forever),
``own-cert`` (ext_proc TLS with a certificate of its own, ignoring ``--certPath``), ``not-serving``
(ext_proc fine, health NOT_SERVING). Unknown flags are accepted, as Go's flag package would not.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epp.server.tls import self_signed, ssl_context


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="good")
    parser.add_argument("--grpcPort", type=int, required=True)
    parser.add_argument("--grpcHealthPort", type=int, required=True)
    parser.add_argument("--certPath", default="")
    args, _unknown = parser.parse_known_args()
    return args


async def main() -> None:
    args = _args()
    servicer = health.aio.HealthServicer()
    status = (
        health_pb2.HealthCheckResponse.NOT_SERVING
        if args.mode == "not-serving"
        else health_pb2.HealthCheckResponse.SERVING
    )
    await servicer.set("", status)
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{args.grpcHealthPort}")
    await server.start()
    listener = None
    if args.mode != "health-only":
        if args.mode == "own-cert":
            context = ssl_context(self_signed())  # a certificate nobody asked for
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.set_alpn_protocols(["h2"])
            context.load_cert_chain(Path(args.certPath) / "tls.crt", Path(args.certPath) / "tls.key")
        listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", args.grpcPort, ssl=context)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    if listener is not None:
        listener.close()
    await server.stop(None)


if __name__ == "__main__":
    asyncio.run(main())
