"""`BodyScanner`: small bodies are scanned in place, big ones in a child process, off the event loop.

An 8.6 MiB body decoded on the loop stalled every other stream and the health probes for ~640 ms on
a loaded machine. Bodies of at least `offload_bytes` go to one long-lived child
(`epp.body.worker`), started on first need and owned by this object: `aclose()` ends it (the EPP's
supervisor calls it at stop). Requests to the child are served one at a time; small bodies never
wait for it.

A child that dies, or an exchange interrupted half way (the stream was cancelled while its body was
being written), leaves the pipe out of step: the child is killed and the next big body starts a new
one. The request that saw the failure gets `Internal` (500): the body was fine, the EPP was not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Sequence

from epp.body.frames import OK, REPLY_HEADER, REQUEST_HEADER
from epp.body.scan import ScannedBody, scan_body
from epp.errors import BadRequest, Internal

log = logging.getLogger(__name__)

WORKER_MODULE = "epp.body.worker"
# Decoding 256 KiB of JSON takes about a millisecond; above that, the round trip to the child is the
# smaller cost for the loop.
DEFAULT_OFFLOAD_BYTES = 256 * 1024
# How long aclose() lets the child exit on EOF before killing it.
_EXIT_GRACE = 2.0


class BodyScanner:
    def __init__(self, offload_bytes: int = DEFAULT_OFFLOAD_BYTES, command: Sequence[str] = ()) -> None:
        """`command` runs the child (default: this interpreter with `-m epp.body.worker`)."""
        self._offload_bytes = offload_bytes
        self._command = tuple(command) or (sys.executable, "-m", WORKER_MODULE)
        # Guards the child and its pipes: one exchange at a time, and start/kill never overlap one.
        self._lock = asyncio.Lock()
        self._child: asyncio.subprocess.Process | None = None
        self._closed = False

    async def scan(self, raw: bytes) -> ScannedBody:
        """`scan_body(raw)`, in a child process when the body is big; raises BadRequest or Internal."""
        if len(raw) < self._offload_bytes:
            return scan_body(raw)
        async with self._lock:
            if self._closed:
                raise Internal("the endpoint picker is shutting down")
            try:
                return await self._exchange(raw)
            except BadRequest:
                raise
            except (OSError, EOFError, asyncio.IncompleteReadError, ValueError) as exc:
                await self._kill()
                raise Internal("the request body parser failed; retry the request") from exc
            except BaseException:
                await self._kill()  # cancelled half way: the pipe is out of step
                raise

    @property
    def child_pid(self) -> int | None:
        """The worker's pid while it runs (for tests and benchmarks)."""
        return self._child.pid if self._child is not None else None

    async def aclose(self) -> None:
        """Stop the child (EOF, then kill after a grace period); later big bodies get Internal."""
        async with self._lock:
            self._closed = True
            child, self._child = self._child, None
            if child is None:
                return
            assert child.stdin is not None
            child.stdin.close()
            try:
                await asyncio.wait_for(child.wait(), _EXIT_GRACE)
            except TimeoutError:
                child.kill()
                await child.wait()

    async def _exchange(self, raw: bytes) -> ScannedBody:
        child = await self._running_child()
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write(REQUEST_HEADER.pack(len(raw)))
        child.stdin.write(raw)
        await child.stdin.drain()
        kind, meta_size, extra_size = REPLY_HEADER.unpack(await child.stdout.readexactly(REPLY_HEADER.size))
        meta = json.loads(await child.stdout.readexactly(meta_size))
        extra = await child.stdout.readexactly(extra_size) if extra_size else None
        if kind != OK:
            raise BadRequest(str(meta["message"]))
        return ScannedBody(
            str(meta["model"]),
            int(meta["start"]),
            int(meta["end"]),
            transcoded=extra,
            prompt_head=str(meta["prompt"]),
        )

    async def _running_child(self) -> asyncio.subprocess.Process:
        child = self._child
        if child is None or child.returncode is not None:
            child = self._child = await asyncio.create_subprocess_exec(
                *self._command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            log.info("request body parser started (pid %d)", child.pid)
        return child

    async def _kill(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
        log.warning("request body parser (pid %d) stopped after a failed exchange", child.pid)
