"""The body-scanning child process (`python -m epp.body.worker`): `scan_body` away from the event loop.

Why a process and not a thread: decoding JSON is C code that holds the GIL for its whole run, so in a
thread an 8 MiB body still stalls every stream and probe of the EPP. The child imports only
`epp.body` and `epp.errors` (no gRPC), so it starts in a fraction of a second and stays small.

Bodies arrive on stdin and replies leave on stdout, framed as `epp.body.frames` says. EOF on stdin
(the EPP stopped, or died) ends the process with status 0. SIGINT is ignored: a Ctrl-C in a terminal
reaches the whole process group, and the EPP decides when its child stops.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import BinaryIO

from epp.body.frames import OK, REFUSED, REPLY_HEADER, REQUEST_HEADER
from epp.body.scan import scan_body
from epp.errors import BadRequest


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def answer(raw: bytes) -> bytes:
    """The reply frame for one body."""
    try:
        scanned = scan_body(raw)
    except BadRequest as err:
        meta = json.dumps({"message": err.message}).encode()
        return REPLY_HEADER.pack(REFUSED, len(meta), 0) + meta
    meta = json.dumps(
        {
            "model": scanned.model,
            "start": scanned.value_start,
            "end": scanned.value_end,
            "prompt": scanned.prompt_head,
        }
    ).encode()
    extra = scanned.transcoded or b""
    return b"".join((REPLY_HEADER.pack(OK, len(meta), len(extra)), meta, extra))


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    while True:
        header = _read_exactly(stdin, REQUEST_HEADER.size)
        if header is None:
            return
        (size,) = REQUEST_HEADER.unpack(header)
        raw = _read_exactly(stdin, size)
        if raw is None:
            return
        stdout.write(answer(raw))
        stdout.flush()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout.buffer)
