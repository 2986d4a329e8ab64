"""A targeted reader of the Prometheus text exposition format.

A vLLM /metrics page is tens of KB, almost all histogram buckets the EPP never looks at, and it is
read 20 times a second per pod. Parsing the whole page into objects (what `prometheus_client`'s
parser does) costs milliseconds; here we jump straight to the sample lines of the few names we need
with `str.find` and parse only those lines. `prometheus_client.parser` is the reference the tests
compare against, including its escape handling (`\\\\`, `\\"` and `\\n` in label values; any other
backslash pair is kept as written).

Only lines that start with the sample name are considered: comment lines (`# HELP`, `# TYPE`) start
with `#`, and a real newline never occurs inside a label value, so every match is a line start.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# One `name="value"` pair, the value with backslash escapes, then an optional comma. Written as an
# unrolled loop (no per-character alternation) so long values stay cheap.
_PAIR = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"[ \t]*(,?)')
_CLOSE = re.compile(r"[ \t]*\}")
_ESCAPE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


class Series(NamedTuple):
    """One sample line: labels, value, and the optional timestamp in milliseconds."""

    labels: dict[str, str]
    value: float
    timestamp_ms: float | None


def find_series(text: str, name: str) -> list[Series]:
    """Every sample line whose metric name is exactly `name`, in page order.

    Raises ValueError on a malformed line of that name (other lines are never looked at).
    """
    return [_parse_rest(rest, name) for rest in _lines_after_name(text, name)]


def _lines_after_name(text: str, name: str) -> list[str]:
    """The remainder (after the name) of every line that starts with exactly `name`."""
    found: list[str] = []
    size = len(name)
    needle = "\n" + name
    if text.startswith(name):
        start = 0
    else:
        start = text.find(needle)
        if start == -1:
            return found
        start += 1
    while True:
        after = start + size
        nxt = text[after : after + 1]
        end = after
        # `name_bucket` or `name2` share the prefix but are other metrics.
        if nxt == "{" or nxt == " " or nxt == "\t":
            end = text.find("\n", after)
            if end == -1:
                end = len(text)
            found.append(text[after:end])
        start = text.find(needle, end)
        if start == -1:
            return found
        start += 1


def _parse_rest(rest: str, name: str) -> Series:
    labels: dict[str, str] = {}
    pos = 0
    if rest.startswith("{"):
        labels, pos = _parse_labels(rest, name)
    fields = rest[pos:].split()
    if len(fields) not in (1, 2):
        raise ValueError(f"malformed sample line for {name!r}: {rest!r}")
    try:
        value = float(fields[0])
        timestamp = float(fields[1]) if len(fields) == 2 else None
    except ValueError:
        raise ValueError(f"malformed sample value for {name!r}: {rest!r}") from None
    return Series(labels, value, timestamp)


def _parse_labels(rest: str, name: str) -> tuple[dict[str, str], int]:
    """Parse `{...}` at the start of `rest`; return the labels and the index after `}`."""
    labels: dict[str, str] = {}
    pos = 1
    while True:
        pair = _PAIR.match(rest, pos)
        if pair is None:
            close = _CLOSE.match(rest, pos)
            if close is None:
                raise ValueError(f"malformed labels for {name!r}: {rest!r}")
            return labels, close.end()
        key, raw, comma = pair.groups()
        labels[key] = _ESCAPE.sub(_unescape, raw) if "\\" in raw else raw
        pos = pair.end()
        if not comma:
            close = _CLOSE.match(rest, pos)
            if close is None:
                raise ValueError(f"malformed labels for {name!r}: {rest!r}")
            return labels, close.end()


def _unescape(match: re.Match[str]) -> str:
    return _ESCAPES[match.group(0)]
