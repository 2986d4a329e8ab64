"""Well-formed requests and trailers (RFC 9113 §8.1.1, §8.2, §8.3): the pure checks, and what a stream
that breaks them gets."""

from __future__ import annotations

import pytest
from hpack import Encoder
from hpack.hpack import decode_integer

from epp.h2 import frames as f
from epp.h2.headers import Malformed, check_request, check_trailers

from .support import PATH, Wire, grpc_message, resets_in

GOOD = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/a.B/C"),
    (b":authority", b"x"),
    (b"te", b"trailers"),
]


def test_a_well_formed_request_gives_its_path_and_content_length() -> None:
    assert check_request(GOOD) == (b"/a.B/C", None)
    assert check_request([*GOOD, (b"content-length", b"12")]) == (b"/a.B/C", 12)


MALFORMED = [
    pytest.param([*GOOD, (b"X-Upper", b"1")], id="uppercase-name"),
    pytest.param([*GOOD, (b":status", b"200")], id="response-pseudo-header"),
    pytest.param([*GOOD, (b":foo", b"1")], id="unknown-pseudo-header"),
    pytest.param([(b"x", b"1"), *GOOD], id="pseudo-header-after-a-field"),
    pytest.param([*GOOD, (b":path", b"/again")], id="duplicated-path"),
    pytest.param([*GOOD, (b":method", b"GET")], id="duplicated-method"),
    pytest.param([p for p in GOOD if p[0] != b":method"], id="no-method"),
    pytest.param([p for p in GOOD if p[0] != b":scheme"], id="no-scheme"),
    pytest.param([p for p in GOOD if p[0] != b":path"], id="no-path"),
    pytest.param([(n, b"" if n == b":path" else v) for n, v in GOOD], id="empty-path"),
    pytest.param([*GOOD, (b"connection", b"keep-alive")], id="connection-specific"),
    pytest.param([*GOOD, (b"transfer-encoding", b"chunked")], id="transfer-encoding"),
    pytest.param([(n, b"gzip" if n == b"te" else v) for n, v in GOOD], id="te-not-trailers"),
    pytest.param([*GOOD, (b"content-length", b"1x")], id="bad-content-length"),
    pytest.param([*GOOD, (b"content-length", b"1"), (b"content-length", b"2")], id="two-content-lengths"),
]


@pytest.mark.parametrize("headers", MALFORMED)
def test_a_malformed_request_is_refused(headers: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(Malformed):
        check_request(headers)


def test_trailers_carry_no_pseudo_headers() -> None:
    check_trailers([(b"grpc-status", b"0")])
    with pytest.raises(Malformed):
        check_trailers([(b":path", b"/")])


def test_trailer_fields_follow_the_rules_of_any_field_section() -> None:
    """RFC 9113 §8.2: lowercase names, no connection-specific fields, TE only as "trailers"."""
    check_trailers([(b"grpc-status", b"0"), (b"te", b"trailers")])
    for field in [(b"Grpc-Status", b"0"), (b"connection", b"close"), (b"te", b"gzip")]:
        with pytest.raises(Malformed):
            check_trailers([field])


def _open(stream_id: int, extra: list[tuple[str, str]], end_stream: bool = False) -> bytes:
    block = Encoder().encode(
        [(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "t"), *extra]
    )
    return f.frame(f.HEADERS, f.END_HEADERS | (f.END_STREAM if end_stream else 0), stream_id, block)


STREAM_ERRORS = [
    pytest.param(_open(1, [("connection", "close")]), id="malformed-request"),
    pytest.param(
        _open(1, [("content-length", "3")]) + f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"x")),
        id="more-data-than-content-length",
    ),
    pytest.param(
        _open(1, [("content-length", "100")]) + f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"x")),
        id="less-data-than-content-length",
    ),
    pytest.param(_open(1, [("content-length", "1")], end_stream=True), id="content-length-without-data"),
    pytest.param(f.frame(f.HEADERS, f.END_HEADERS, 1, b""), id="empty-header-block"),
    pytest.param(  # the priority fields alone: read, then an empty block
        f.frame(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, b"\x00\x00\x00\x00\x10"),
        id="priority-and-no-header-block",
    ),
    pytest.param(
        _open(1, [])
        + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, Encoder().encode([(":path", "/")])),
        id="pseudo-header-in-trailers",
    ),
    pytest.param(
        _open(1, []) + f.frame(f.HEADERS, f.END_HEADERS, 1, Encoder().encode([("x-more", "1")])),
        id="a-second-header-block-without-end-stream",
    ),
]


@pytest.mark.parametrize("frames", STREAM_ERRORS)
def test_a_malformed_stream_is_reset_with_protocol_error_and_the_connection_serves_on(frames: bytes) -> None:
    wire = Wire()
    wire.transport.take()
    wire.raw(frames)
    assert resets_in(wire.transport.take()) == {1: f.PROTOCOL_ERROR}
    ok = grpc_message(b"ok")  # its content-length met over two DATA frames
    wire.raw(_open(3, [("content-length", str(len(ok)))]))
    wire.raw(f.frame(f.DATA, 0, 3, ok[:4]) + f.frame(f.DATA, f.END_STREAM, 3, ok[4:]))
    assert wire.recorder.handlers[-1].messages == [b"ok"]
    assert resets_in(wire.transport.take()) == {}
    assert not wire.transport.closed


def test_hpack_integers_are_rfc_7541s_examples() -> None:
    # RFC 7541 C.1: 10 and 1337 with a 5-bit prefix, 42 starting at an octet boundary.
    assert f.hpack_integer(10, 5) == b"\x0a"
    assert f.hpack_integer(1337, 5) == b"\x1f\x9a\x0a"
    assert f.hpack_integer(42, 8) == b"\x2a"


@pytest.mark.parametrize(
    ("value", "prefix_bits"),
    # Each side of the prefix's limit and of the first continuation byte's (limit + 128).
    [
        (30, 5),
        (31, 5),
        (32, 5),
        (158, 5),
        (159, 5),
        (160, 5),
        (126, 7),
        (127, 7),
        (255, 7),
        (2**21, 7),
        (0, 8),
    ],
)
def test_hpack_integers_read_back_as_an_hpack_decoder_reads_them(value: int, prefix_bits: int) -> None:
    """What our header blocks carry for lengths and indices: a long header value (127 bytes and more)
    needs the multi-byte form, which a peer's decoder must read as the same number."""
    encoded = f.hpack_integer(value, prefix_bits, first=0)
    assert decode_integer(encoded, prefix_bits) == (value, len(encoded))


@pytest.mark.parametrize(
    ("message", "encoded"),
    [
        pytest.param(" ~", b" ~", id="printable-ends-kept"),
        pytest.param("\x1f\x7f", b"%1F%7F", id="just-outside-encoded"),
        pytest.param("100%", b"100%25", id="percent-encoded"),
        pytest.param("é", b"%C3%A9", id="utf-8-bytes-encoded"),
        pytest.param("\ud800", b"?", id="a-lone-surrogate-replaced"),
    ],
)
def test_grpc_message_is_percent_encoded_outside_printable_ascii(message: str, encoded: bytes) -> None:
    """gRPC's rule for `grpc-message`: 0x20-0x7E stay, except `%`; everything else (UTF-8) is %XX."""
    assert f.grpc_message_encode(message) == encoded
