"""Sockets for tests of connection handling: a port whose connections never complete, and the
count of this process's open sockets to a port (the client's side of its connections).

Both read or shape the kernel's state directly, so a test can tell "closed" from "closing" and
"connecting" from "refused" without waiting on a guess.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path


def unaccepting_port(stack: contextlib.ExitStack) -> int:
    """A port whose accept queue is full: a new connection's SYN is dropped, so connecting hangs."""
    listener = stack.enter_context(socket.socket())
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port: int = listener.getsockname()[1]
    for _ in range(3):  # backlog 0 still queues one; the rest are left half-open
        filler = stack.enter_context(socket.socket())
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
    return port


def client_sockets_to(port: int) -> int:
    """Open sockets of this process whose remote end is 127.0.0.1:`port` (the client's side)."""
    ours = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue  # closed while we looked
        if target.startswith("socket:["):
            ours.add(target[len("socket:[") : -1])
    count = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port == port and fields[9] in ours:
            count += 1
    return count
