"""Token usage from a model server's response, read without ever changing the response.

Two shapes (epp-behaviour.md §6.7): a JSON body with `usage.prompt_tokens/completion_tokens`, and an
SSE stream whose `data: ` events carry a usage object (vLLM sends it in a final chunk when the client
asked for `stream_options.include_usage`). Upstream only parsed the chunk that also held
`data: [DONE]`, so usage split across chunks was lost; here SSE lines are reassembled across chunk
boundaries and the last decodable usage wins. Anything unparsable is ignored: usage is best effort.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# A non-streaming body is held until end_of_stream to find its usage; beyond this size we stop
# holding it (the response still flows untouched, only its token counts go unrecorded).
MAX_JSON_RESPONSE_BYTES = 16 * 1024 * 1024
# An SSE line longer than this is not a usage event; drop it instead of buffering without bound.
MAX_SSE_LINE_BYTES = 1024 * 1024

_DATA = b"data:"
_DONE = b"[DONE]"
_USAGE = b'"usage"'


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _count(value: object) -> int:
    # bool is an int subclass; a float count like 12.0 is accepted, anything else counts as absent.
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return 0


def usage_from_object(obj: Any) -> Usage | None:
    """The `usage` of a decoded response object, or None when it has none (or `usage: null`)."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    return Usage(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))


def usage_from_json(body: bytes) -> Usage | None:
    try:
        return usage_from_object(json.loads(body))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return None


class SseUsageScanner:
    """Feed SSE chunks as they pass; `usage` is the last usage object seen in a complete `data:` line."""

    __slots__ = ("_partial", "_skipping", "usage")

    def __init__(self) -> None:
        self._partial = b""
        self._skipping = False  # inside an over-long line: drop bytes until its newline
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        data = self._partial + chunk if self._partial else chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if self._skipping:
                self._skipping = False
                continue
            self._line(line)
        if len(self._partial) > MAX_SSE_LINE_BYTES:
            self._partial = b""
            self._skipping = True

    def finish(self) -> None:
        """End of stream: a last line without a trailing newline still counts."""
        if self._partial and not self._skipping:
            self._line(self._partial)
        self._partial = b""

    def _line(self, line: bytes) -> None:
        # Cheap filters first: only `data:` lines mentioning "usage" are worth decoding.
        if not line.startswith(_DATA) or _USAGE not in line:
            return
        payload = line[len(_DATA) :].strip()
        if payload == _DONE:
            return
        found = usage_from_json(payload)
        if found is not None:
            self.usage = found
