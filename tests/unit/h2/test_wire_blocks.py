"""What the server writes, read back the way a peer reads it: the header blocks it builds (decoded
by the `hpack` library's decoder, as a client would), and the frame flags (RFC 9113 §4.1: flags a
frame type does not define MUST be left unset when sending)."""

from __future__ import annotations

import hpack
import pytest

from epp.h2 import frames as f

from .support import frames_in


def decoded(block: bytes) -> list[tuple[str, str]]:
    return [(str(name), str(value)) for name, value in hpack.Decoder().decode(block)]


def test_the_response_headers_are_status_200_and_the_grpc_content_type() -> None:
    assert decoded(f.RESPONSE_HEADERS) == [(":status", "200"), ("content-type", "application/grpc")]


@pytest.mark.parametrize("length", [0, 1, 126, 127, 128, 300, 20_000])
def test_a_literal_with_an_indexed_name_reads_back_at_every_length_form(length: int) -> None:
    """Values of 127 bytes and more need the multi-byte length; the name index 31 (content-type)
    fits the 4-bit prefix, index 58 (user-agent) does not."""
    value = bytes(ord("a") + i % 26 for i in range(length))
    assert decoded(f.literal_indexed_name(31, value)) == [("content-type", value.decode())]
    assert decoded(f.literal_indexed_name(58, value)) == [("user-agent", value.decode())]


@pytest.mark.parametrize("name_length", [1, 126, 127, 128, 300])
def test_a_literal_with_a_new_name_reads_back_at_every_length_form(name_length: int) -> None:
    name = b"x-" + b"n" * (name_length - 2) if name_length > 2 else b"x" * name_length
    assert decoded(f.literal(name, b"v" * name_length)) == [(name.decode(), "v" * name_length)]


def test_ok_trailers_carry_grpc_status_0_and_no_message() -> None:
    assert decoded(f.OK_TRAILERS) == [("grpc-status", "0")]
    assert decoded(f.trailers(0)) == [("grpc-status", "0")]


def test_error_trailers_carry_the_status_and_the_percent_encoded_message() -> None:
    assert decoded(f.trailers(13, "bad: 100% wrong")) == [
        ("grpc-status", "13"),
        ("grpc-message", "bad: 100%25 wrong"),
    ]


def test_a_goaway_without_debug_data_carries_only_the_last_stream_and_the_code() -> None:
    [(kind, flags, stream, payload)] = frames_in(f.goaway(7, f.NO_ERROR))
    assert (kind, flags, stream) == (f.GOAWAY, 0, 0)
    assert payload == f.U32.pack(7) + f.U32.pack(f.NO_ERROR)


@pytest.mark.parametrize(
    ("written", "kind"),
    [
        pytest.param(f.rst_stream(3, f.CANCEL), f.RST_STREAM, id="rst-stream"),
        pytest.param(f.goaway(3, f.PROTOCOL_ERROR, b"why"), f.GOAWAY, id="goaway"),
        pytest.param(f.window_update(3, 10), f.WINDOW_UPDATE, id="window-update"),
        pytest.param(f.settings_frame({f.SETTINGS_ENABLE_PUSH: 0}), f.SETTINGS, id="settings"),
    ],
)
def test_frame_types_without_flags_are_sent_with_none_set(written: bytes, kind: int) -> None:
    [(got_kind, flags, _stream, _payload)] = frames_in(written)
    assert got_kind == kind
    assert flags == 0
