"""gRPC bidirectional streams over HTTP/2, served on asyncio directly: the ext_proc transport.

Why not grpc.aio: measured behind Envoy (``benchmarks/bench_e2e_latency.py``), grpc.aio spent about
three quarters of the EPP's CPU per request in its own machinery (a poller thread handing every
completion-queue event to the event loop through a socket, a task and an async generator per
stream), three times the whole cost of the ext_proc work itself. An ext_proc stream needs little of
gRPC: one method, length-prefixed messages, a status in trailers. This package implements exactly
that on an ``asyncio.Protocol`` (RFC 9113 framing, flow control both ways, HPACK decoding by
``hpack``), parses every frame of a read in one pass, steps each message's handler without a task
when it does not suspend, and writes everything a pass produced at once.

Not implemented, because Envoy's gRPC client never uses them: message compression (a compressed
message ends its stream with UNIMPLEMENTED), server push, priorities (ignored), deadlines
(``grpc-timeout`` is Envoy's to enforce), unary or server-streaming methods.
"""

from epp.h2.limits import Limits
from epp.h2.server import GrpcServer, server_ssl_context
from epp.h2.streams import GrpcStream, Replies, StreamError

__all__ = ["GrpcServer", "GrpcStream", "Limits", "Replies", "StreamError", "server_ssl_context"]
