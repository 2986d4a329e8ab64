"""Value parsers for the EPP's flags, in the spelling Go's `flag`/pflag and controller-runtime's zap
flags accept (durations such as `1m30s`, `512Ki` sizes, Go booleans, `key=value` selectors), and the
error every bad command line becomes. Kept apart from the flag table (`epp.server.flags`) so each
rule is one small function with its own message, shared by every flag that takes such a value."""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable
from typing import TypeVar

DEFAULT_VERBOSITY = 2
# zap levels as upstream: 2 default, 3 verbose, 4 debug, 5 trace. Python has no finer level than DEBUG.
DEBUG_VERBOSITY = 4

T = TypeVar("T")


class FlagError(ValueError):
    """Bad command line; the message says which flag and why."""


# zap's named levels, as Python levels (zap's dpanic/panic/fatal all mean "only the worst").
ZAP_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "dpanic": logging.CRITICAL,
    "panic": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}
LOG_ENCODERS = ("console", "json")
ZAP_TIME_ENCODINGS = ("epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano")

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds from a Go duration string (`time.ParseDuration`): `300ms`, `1.5s`, `1h2m`, `0`."""
    s = text.strip()
    sign = 1.0
    if s and s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    while pos < len(s):
        match = _DURATION_PART.match(s, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r} (expected e.g. 50ms, 5s, 1m30s)")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total


def non_negative_duration(text: str) -> float:
    seconds = parse_go_duration(text)
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {text!r}")
    return seconds


def positive_duration(text: str) -> float:
    seconds = parse_go_duration(text)
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return seconds


_BYTE_UNITS = {"": 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
_BYTE_SIZE = re.compile(r"(\d+)(Ki|Mi|Gi)?")


def parse_byte_size(text: str) -> int:
    """Bytes from `16777216` or a Kubernetes-style binary suffix: `512Ki`, `16Mi`, `1Gi`."""
    match = _BYTE_SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid size {text!r} (expected e.g. 16777216, 512Ki, 16Mi)")
    return int(match.group(1)) * _BYTE_UNITS[match.group(2) or ""]


def zap_level(text: str) -> int:
    """A zap level name, or a number N > 0 meaning verbosity N (as `-v N`)."""
    if text.isdigit() and int(text) > 0:
        return logging.DEBUG if int(text) >= DEBUG_VERBOSITY else logging.INFO
    try:
        return ZAP_LEVELS[text.lower()]
    except KeyError:
        raise ValueError(
            f"invalid zap log level {text!r} (debug, info, error, panic or a number > 0)"
        ) from None


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"invalid value {text!r} (one of: {', '.join(allowed)})")
        return text

    return parse


def port_number(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port} (0 picks a free port)")
    return port


_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def label_selector(text: str) -> tuple[tuple[str, str], ...]:
    """`key=value,key2=value2` (upstream's `--endpoint-selector`): equality only, no spaces."""
    pairs: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if not eq or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise ValueError(f"invalid selector {text!r}: expected key=value pairs separated by commas")
        if key in pairs:
            raise ValueError(f"invalid selector {text!r}: {key!r} given twice")
        pairs[key] = value
    return tuple(pairs.items())


def port_list(text: str) -> list[int]:
    """`3000,3001` (pflag's int slice; the flag may also be repeated)."""
    ports = []
    for part in text.split(","):
        port = int(part)
        if not 1 <= port <= 65535:
            raise ValueError(f"port out of range: {port}")
        ports.append(port)
    return ports


_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


def go_bool(text: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid boolean {text!r}")


def typed(convert: Callable[[str], T], what: str) -> Callable[[str], T]:
    def parse(text: str) -> T:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc) or f"invalid {what}: {text!r}") from exc

    parse.__name__ = what
    return parse
