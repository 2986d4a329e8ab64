"""The peer's SETTINGS_INITIAL_WINDOW_SIZE at its edges (RFC 9113 §6.5.2, §6.9.2): up to 2^31-1 is
legal, and so is a change that takes an open stream's window exactly to 2^31-1; one past either is a
FLOW_CONTROL_ERROR named in the GOAWAY. The check keeps a bound on the streams' credit that may be
stale (a stream with a large credit that has since closed): recomputed, never trusted blindly, even
when no stream is left."""

from __future__ import annotations

import pytest

from epp.h2 import frames as f

from .support import Wire, goaway_code, goaway_debug, header_block


def initial_window(value: int) -> bytes:
    return f.settings_frame({f.SETTINGS_INITIAL_WINDOW_SIZE: value})


def open_stream_with_credit(wire: Wire, stream_id: int, credit: int) -> None:
    wire.raw(f.frame(f.HEADERS, f.END_HEADERS, stream_id, header_block()))
    wire.raw(f.window_update(stream_id, credit))


@pytest.mark.parametrize(
    ("frames", "code", "why"),
    [
        pytest.param(
            initial_window(f.MAX_WINDOW + 1), f.FLOW_CONTROL_ERROR, "initial window over 2^31-1", id="over"
        ),
        pytest.param(
            f.settings_frame({f.SETTINGS_ENABLE_PUSH: 2}),
            f.PROTOCOL_ERROR,
            "ENABLE_PUSH of 2",
            id="enable-push-2",
        ),
    ],
)
def test_settings_out_of_range_end_the_connection_naming_why(frames: bytes, code: int, why: str) -> None:
    wire = Wire()
    wire.raw(frames)
    out = wire.transport.take()
    assert (goaway_code(out), goaway_debug(out)) == (code, why)


@pytest.mark.parametrize(
    ("past", "code"), [(0, None), (1, f.FLOW_CONTROL_ERROR)], ids=["exactly", "one-past"]
)
def test_a_new_initial_window_may_take_an_open_stream_s_window_exactly_to_the_limit(
    past: int, code: int | None
) -> None:
    wire = Wire()
    credit = 1_000_000
    open_stream_with_credit(wire, 1, credit)
    wire.transport.take()
    wire.raw(initial_window(f.MAX_WINDOW - credit + past))
    out = wire.transport.take()
    assert goaway_code(out) == code
    if code is not None:
        assert goaway_debug(out) == "the new initial window overflows a stream's"


def test_the_largest_initial_window_is_accepted_once_the_stream_with_a_large_credit_is_gone() -> None:
    wire = Wire()
    open_stream_with_credit(wire, 1, 1_000_000)
    wire.raw(f.frame(f.DATA, f.END_STREAM, 1, b"\x00\x00\x00\x00\x03end"))  # answered and closed
    assert wire.server.open_streams == 0
    wire.transport.take()
    wire.raw(initial_window(f.MAX_WINDOW))
    assert goaway_code(wire.transport.take()) is None
    assert not wire.transport.closed
