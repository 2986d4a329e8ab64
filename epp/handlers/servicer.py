"""The gRPC side of ext_proc: moves bytes between Envoy and one `ExtProcStream` per stream.

Two transports carry the same streams: `add_to_h2_server` (ours, `epp.h2`, the default) and
`add_to_server` (grpc.aio, the fallback of `--extProcTransport=grpcio`). On grpc.aio it is
registered as a generic handler without (de)serializers, rather than through
`add_ExternalProcessorServicer_to_server`, for two reasons: constant replies go out as
pre-serialised bytes, and an undecodable message is caught here and answered with
INVALID_ARGUMENT for that stream only (the server keeps serving), instead of grpc's own
deserializer failure path. On `epp.h2` the same error becomes a `StreamError` with that status.

A client cancel or EOF ends the handler quietly (upstream #390): cancellation propagates without a
log line and the stream's bookkeeping (running-requests gauge) is released in `finally`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from epp.body import BodyScanner
from epp.config import (
    DEFAULT_DESTINATION_FALLBACKS,
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    NO_CONFORMANCE_HOOKS,
    ConformanceHooks,
)
from epp.h2 import GrpcServer, StreamError
from epp.handlers.accounting import NO_ACCOUNTING, Accounting
from epp.handlers.responses import ConstantReplies, Destination
from epp.handlers.stream import ExtProcStream, PodScheduler, ProtocolError, Reply, RoutingView, StreamDeps
from epp.metrics import RequestMetrics

log = logging.getLogger(__name__)

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD_NAME = "Process"
METHOD_PATH = f"/{SERVICE_NAME}/{METHOD_NAME}"
_INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


class _H2Stream:
    """One ext_proc stream as `epp.h2` drives it: a `ProtocolError` ends it with INVALID_ARGUMENT."""

    __slots__ = ("_stream",)

    def __init__(self, stream: ExtProcStream) -> None:
        self._stream = stream

    async def handle(self, message: bytes) -> tuple[Reply, bool]:
        try:
            return await self._stream.handle(message)
        except ProtocolError as exc:
            problem = str(exc)  # logged as text: a record holding the exception would keep its frames
        log.warning("ext_proc protocol error: %s", problem)
        raise StreamError(_INVALID_ARGUMENT, problem)

    def close(self) -> None:
        self._stream.close()


class ExtProcServicer:
    """`envoy.service.ext_proc.v3.ExternalProcessor/Process`; add it with `add_to_server`."""

    def __init__(
        self,
        datastore: RoutingView,
        scheduler: PodScheduler,
        metrics: RequestMetrics,
        *,
        destination_header_key: str,
        metadata_namespace: str,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
        body_scanner: BodyScanner | None = None,
        accounting: Accounting = NO_ACCOUNTING,
        destination_fallbacks: int = DEFAULT_DESTINATION_FALLBACKS,
        endpoint_subset_filter: bool = True,
        conformance: ConformanceHooks = NO_CONFORMANCE_HOOKS,
    ) -> None:
        # Envoy hands header names over lower-cased; compare and mutate in that form.
        key = destination_header_key.lower()
        # A scanner made here is ours to close (`aclose`); one passed in belongs to the caller.
        self._own_scanner = body_scanner is None
        scanner = body_scanner if body_scanner is not None else BodyScanner()
        self._deps = StreamDeps(
            datastore=datastore,
            scheduler=scheduler,
            metrics=metrics,
            rng=rng if rng is not None else random.Random(),
            clock=clock,
            destination=Destination(key, metadata_namespace),
            replies=ConstantReplies.build(key),
            body_scanner=scanner,
            max_body_bytes=max_request_body_bytes,
            accounting=accounting,
            fallbacks=max(0, destination_fallbacks),
            subset_filter=endpoint_subset_filter,
            conformance=conformance,
        )

    async def aclose(self) -> None:
        """Stop the body-scanning child, if this servicer made the scanner (call after the server stops)."""
        if self._own_scanner:
            await self._deps.body_scanner.aclose()

    def new_stream(self) -> ExtProcStream:
        """The per-stream state machine on its own, fed serialised messages directly (no gRPC)."""
        return ExtProcStream(self._deps)

    async def process(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        stream = self.new_stream()
        try:
            async for raw in requests:
                try:
                    reply, end = await stream.handle(raw)
                except ProtocolError as exc:
                    problem = str(exc)
                else:
                    problem = ""
                if problem:
                    # Status set and a plain return rather than context.abort(): no exception object
                    # (and its frames) is left in a reference cycle with the server's call state.
                    log.warning("ext_proc protocol error: %s", problem)
                    context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
                    context.set_details(problem)
                    return
                if isinstance(reply, tuple):
                    for one in reply:
                        yield one
                elif reply is not None:
                    yield reply
                if end:
                    return
        finally:
            stream.close()

    def add_to_h2_server(self, server: GrpcServer) -> None:
        """Register on an `epp.h2.GrpcServer` (before it starts)."""
        server.add_method(METHOD_PATH, lambda: _H2Stream(self.new_stream()))

    def add_to_server(self, server: Any) -> None:
        """Register on a `grpc.aio.Server` (raw bytes in and out, see the module docstring)."""
        handler = grpc.method_handlers_generic_handler(
            SERVICE_NAME, {METHOD_NAME: grpc.stream_stream_rpc_method_handler(self.process)}
        )
        server.add_generic_rpc_handlers((handler,))
