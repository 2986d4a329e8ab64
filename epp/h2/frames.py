"""HTTP/2 frame layout (RFC 9113 §4, §6) and the few header blocks a gRPC server sends (RFC 7541).

Pure data and functions. The server only ever *encodes* constant or near-constant header blocks
(``:status 200``, ``content-type``, ``grpc-status``, ``grpc-message``) as HPACK literals "without
indexing", so it never touches its encoder's dynamic table and needs no HPACK encoder at all;
decoding the client's blocks (which do use the table) is ``hpack.Decoder``'s job.
"""

from __future__ import annotations

import struct
from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES: Final = 9

# Frame types (§6).
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# Flags.
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# Settings (§6.5.2).
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6

# Error codes (§7).
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

DEFAULT_WINDOW: Final = 65_535
MAX_WINDOW: Final = 2**31 - 1
DEFAULT_MAX_FRAME: Final = 16_384
PRIORITY_BYTES: Final = 5  # stream dependency (31 bits and E) and weight
MAX_FRAME_LIMIT: Final = 2**24 - 1

# A frame header: 24-bit length (as 16 + 8 bits), type, flags, 31-bit stream id.
FRAME_HEADER: Final = struct.Struct(">HBBBI")
U32: Final = struct.Struct(">I")
SETTING: Final = struct.Struct(">HI")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame, header and payload."""
    length = len(payload)
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(SETTING.pack(key, value) for key, value in settings.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, U32.pack(last_stream_id) + U32.pack(code) + debug)


# --- HPACK literals (RFC 7541 §5.1, §6.2.2) -------------------------------------------------------


def hpack_integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """``value`` in HPACK's prefixed integer encoding; ``first`` holds the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman coding."""
    return b"\x00" + hpack_integer(len(name), 7) + name + hpack_integer(len(value), 7) + value


def literal_indexed_name(index: int, value: bytes) -> bytes:
    """A literal without indexing whose name is entry ``index`` of the static table."""
    return hpack_integer(index, 4) + hpack_integer(len(value), 7) + value


_STATUS_200: Final = b"\x88"  # static table entry 8, ":status: 200"
_CONTENT_TYPE: Final = 31  # static table entry 31, "content-type"

RESPONSE_HEADERS: Final = _STATUS_200 + literal_indexed_name(_CONTENT_TYPE, b"application/grpc")
"""What a gRPC server sends before its first message."""


def grpc_message_encode(message: str) -> bytes:
    """``grpc-message``'s percent-encoding: UTF-8, then every byte outside 0x20-0x7E and ``%`` as %XX."""
    out = bytearray()
    for byte in message.encode("utf-8", "replace"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def trailers(status: int, message: str = "") -> bytes:
    """The header block that ends a gRPC response: ``grpc-status`` and, when set, ``grpc-message``."""
    block = literal(b"grpc-status", str(status).encode())
    if message:
        block += literal(b"grpc-message", grpc_message_encode(message))
    return block


OK_TRAILERS: Final = trailers(0)
