"""One gRPC stream as the connection keeps it, and the contract of the handler behind it."""

from __future__ import annotations

import asyncio
import collections
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final, Protocol

from epp.h2.flow import Inbound

# gRPC status codes used here.
OK: Final = 0
UNKNOWN: Final = 2
INVALID_ARGUMENT: Final = 3
RESOURCE_EXHAUSTED: Final = 8
UNIMPLEMENTED: Final = 12

GRPC_PREFIX_BYTES: Final = 5


class StreamError(Exception):
    """Raised by a stream handler to end its stream with a gRPC status other than OK."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Replies = bytes | tuple[bytes, ...] | None
"""What a handler answers one message with: nothing, one message, or several in order."""


class GrpcStream(Protocol):
    """One RPC: ``handle`` each request message in order, ``close`` exactly once when it ends.

    ``handle`` returns (replies, end): ``end`` finishes the RPC with OK after the replies. Its first
    step runs outside any task (see ``epp.h2.connection``): code before its first suspension must
    not need ``asyncio.current_task()`` (``asyncio.timeout`` does).
    """

    async def handle(self, message: bytes) -> tuple[Replies, bool]: ...

    def close(self) -> None: ...


StreamFactory = Callable[[], GrpcStream]


class Stream:
    """A stream's state. Send windows are kept relative to the peer's SETTINGS_INITIAL_WINDOW_SIZE
    (``send_credit``: its WINDOW_UPDATEs minus what was sent), so a change of that setting costs
    nothing per stream."""

    __slots__ = (
        "buffer",
        "close_after_task",
        "content_left",
        "counted",
        "finished",
        "handler",
        "handler_closed",
        "headers_sent",
        "held",
        "id",
        "lent",
        "pending",
        "queue",
        "recv",
        "remote_closed",
        "reserved",
        "send_credit",
        "task",
        "trailers",
    )

    def __init__(self, stream_id: int, handler: GrpcStream, recv_window: int) -> None:
        self.id = stream_id
        self.handler = handler
        self.buffer = bytearray()  # a partial gRPC message
        self.content_left: int | None = None  # of a declared content-length, still to come
        self.held = 0  # DATA payload bytes received and not yet handed to the handler or dropped
        self.recv = Inbound(recv_window)
        self.reserved = 0  # of the connection's reservation budget, for the message in `buffer`
        self.lent = 0  # stream credit granted past the window for that message, not given back
        self.counted = 0  # what `buffer` adds to the connection's unreserved incomplete bytes
        self.send_credit = 0
        self.pending: collections.deque[memoryview] = collections.deque()  # DATA held by flow control
        self.trailers: bytes | None = None  # held behind `pending`
        self.queue: collections.deque[bytes] = collections.deque()  # messages behind a suspended handle
        self.task: asyncio.Task[None] | None = None
        self.headers_sent = False
        self.remote_closed = False  # the peer sent END_STREAM
        self.finished = False  # our trailers are decided (sent or held)
        self.handler_closed = False
        self.close_after_task = False  # released while a handle() was suspended


@types.coroutine
def continue_coroutine(
    coro: Coroutine[Any, Any, Any], pending: Any, blocking: bool = False
) -> Generator[Any, Any, Any]:
    """Run the rest of a coroutine that was stepped by hand and suspended on ``pending`` (a future
    whose "blocking" mark was taken off when ``blocking``: it is put back for the task to see)."""
    if blocking and not pending.done():
        pending._asyncio_future_blocking = True
    elif blocking:  # done meanwhile: the coroutine resumes at once, as a task would resume it
        pending = None
    while True:
        try:
            sent = yield pending
        except BaseException as exc:  # cancellation and errors of what it awaits go to it
            try:
                pending = coro.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                pending = coro.send(sent)
            except StopIteration as done:
                return done.value
