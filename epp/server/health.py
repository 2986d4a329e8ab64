"""gRPC health (`grpc.health.v1.Health`) on its own plaintext port, as upstream (§7.2).

SERVING iff the datastore knows the pool and the EPP is not draining (the runner passes that rule
in). The requested service name is ignored on purpose: Kubernetes probes ask for
`inference-extension`, and requiring the ext_proc service name broke them upstream (#788).
`Watch` is not implemented; `List` reports the ext_proc service and "".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.handlers import SERVICE_NAME

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServicer:
    """Duck-typed servicer for `health_pb2_grpc.add_HealthServicer_to_server`."""

    def __init__(self, is_serving: Callable[[], bool]) -> None:
        self._is_serving = is_serving

    def _status(self) -> Any:
        return _SERVING if self._is_serving() else _NOT_SERVING

    # Method names are fixed by the gRPC service definition.
    async def Check(self, request: Any, context: Any) -> Any:
        return health_pb2.HealthCheckResponse(status=self._status())

    async def List(self, request: Any, context: Any) -> Any:
        status = health_pb2.HealthCheckResponse(status=self._status())
        response = health_pb2.HealthListResponse()
        for name in ("", SERVICE_NAME):
            response.statuses[name].CopyFrom(status)
        return response

    async def Watch(self, request: Any, context: Any) -> None:
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details("Watch is not implemented; use Check")

    def add_to_server(self, server: Any) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self, server)
