"""Which decoded header blocks are well-formed requests and trailers (RFC 9113 §8.2, §8.3). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

Headers = Sequence[tuple[bytes, bytes]]

_REQUEST_PSEUDO: Final = frozenset({b":method", b":scheme", b":path", b":authority"})
_REQUIRED: Final = frozenset({b":method", b":scheme", b":path"})
# Connection-specific fields an HTTP/2 message must not carry (§8.2.2).
_CONNECTION_SPECIFIC: Final = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)


class Malformed(ValueError):
    """The block is not a well-formed request (a stream error of type PROTOCOL_ERROR)."""


def check_request(headers: Headers) -> tuple[bytes, int | None]:
    """A request's ``:path`` and declared ``content-length`` (None when it declares none)."""
    seen: set[bytes] = set()
    regular = False
    path = b""
    length: int | None = None
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                raise Malformed(f"pseudo-header {name!r} after a regular field")
            if name not in _REQUEST_PSEUDO:
                raise Malformed(f"pseudo-header {name!r} is not a request's")
            if name in seen:
                raise Malformed(f"pseudo-header {name!r} twice")
            seen.add(name)
            if name == b":path":
                if not value:
                    raise Malformed("empty :path")
                path = value
            continue
        regular = True
        _check_field(name, value)
        if name == b"content-length":
            declared = _content_length(value)
            if length is not None and declared != length:
                raise Malformed("two different content-length values")
            length = declared
    missing = _REQUIRED - seen
    if missing:
        raise Malformed(f"no {', '.join(sorted(m.decode() for m in missing))}")
    return path, length


def check_trailers(headers: Headers) -> None:
    for name, value in headers:
        if name[:1] == b":":
            raise Malformed(f"pseudo-header {name!r} in trailers")
        _check_field(name, value)


def _check_field(name: bytes, value: bytes) -> None:
    if name != name.lower():
        raise Malformed(f"field name {name!r} not in lowercase")
    if name in _CONNECTION_SPECIFIC:
        raise Malformed(f"connection-specific field {name!r}")
    if name == b"te" and value != b"trailers":
        raise Malformed("te other than trailers")


def _content_length(value: bytes) -> int:
    if not value.isdigit():
        raise Malformed(f"content-length {value!r}")
    return int(value)
