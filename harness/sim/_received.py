"""What a simulator received: every generation request's headers (repeats kept) and body, as sent.

Tests check what reaches a model server, not only where it went (STYLE habit 21): one destination
header with the right value, the model rewritten as expected, no header a client should not be able
to pass through the gateway. Bounded, so a long benchmark never grows without limit.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from dataclasses import dataclass

# Enough for any test; a benchmark's older requests fall off the front.
MAX_RECORDED = 1000


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]  # (lower-case name, value) in arrival order, repeats kept
    body: bytes
    # The HTTP version it came in over: "1.1", or "2" through the h2c listener (`SimConfig.h2c`).
    http_version: str = "1.1"

    def header_values(self, name: str) -> list[str]:
        """Every value sent under `name` (case-insensitive): one entry per header line."""
        wanted = name.lower()
        return [value for key, value in self.headers if key == wanted]


class ReceivedLog:
    """Thread-safe: the simulator's loop appends, tests read from any thread.

    Entries are kept as they came (header bytes undecoded): the decoding is left to whoever reads
    them, so a benchmark's thousands of requests a second pay only for an append.
    """

    def __init__(self, limit: int = MAX_RECORDED) -> None:
        self._lock = threading.Lock()
        self._requests: collections.deque[tuple[str, str, tuple[tuple[bytes, bytes], ...], bytes, str]] = (
            collections.deque(maxlen=limit)
        )

    def record(
        self,
        method: str,
        path: str,
        raw_headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        http_version: str = "1.1",
    ) -> None:
        entry = (method, path, tuple(raw_headers), body, http_version)
        with self._lock:
            self._requests.append(entry)

    def snapshot(self) -> list[ReceivedRequest]:
        with self._lock:
            entries = list(self._requests)
        return [
            ReceivedRequest(
                method,
                path,
                tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in raw_headers),
                body,
                http_version,
            )
            for method, path, raw_headers, body, http_version in entries
        ]
