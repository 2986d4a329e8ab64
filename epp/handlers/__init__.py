"""The ext_proc server: Envoy asks, for every request, which model server pod should serve it.

`ExtProcServicer` is the grpc.aio glue; `ExtProcStream` holds one request's state and every protocol
decision; `request`, `usage` and `responses` are the pure parts (parsing, token usage, messages).
"""

from epp.handlers.servicer import SERVICE_NAME, ExtProcServicer
from epp.handlers.stream import ExtProcStream, PodScheduler, ProtocolError, RoutingView

__all__ = [
    "SERVICE_NAME",
    "ExtProcServicer",
    "ExtProcStream",
    "PodScheduler",
    "ProtocolError",
    "RoutingView",
]
