"""The `--h2-*` flags: one per limit of the ext_proc port's HTTP/2 server (`epp.h2.Limits`), each
defaulting to the limit's own default, and their conversion into a `Limits` with a bad value named
by its flag. Ours, not upstream's (README, "Hardening")."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from epp.h2.limits import Limits
from epp.server.flag_values import FlagError, non_negative_duration, parse_byte_size, typed

H2_FLAGS: tuple[tuple[str, str, Callable[[str], int | float], str], ...] = (
    ("--h2-max-concurrent-streams", "max_concurrent_streams", int, "Streams per connection (advertised)."),
    (
        "--h2-stream-window",
        "stream_window",
        parse_byte_size,
        "Receive window per stream (bytes, 256Ki); widened for a message longer than it.",
    ),
    (
        "--h2-connection-window",
        "connection_window",
        parse_byte_size,
        "Receive window per connection; raised to hold a largest message, 8 stream windows and a frame.",
    ),
    ("--h2-max-connections", "max_connections", int, "Connections at once; more are refused."),
    (
        "--h2-preface-timeout",
        "preface_timeout",
        non_negative_duration,
        "TLS handshake and preface (0: off).",
    ),
    (
        "--h2-header-timeout",
        "header_timeout",
        non_negative_duration,
        "A header block or control frame left incomplete.",
    ),
    (
        "--h2-idle-timeout",
        "idle_timeout",
        non_negative_duration,
        "A connection with no stream; a peer that reads nothing.",
    ),
    ("--h2-max-continuation-frames", "max_continuation_frames", int, "CONTINUATION frames per header block."),
    (
        "--h2-max-queued-control-frames",
        "max_queued_control_frames",
        int,
        "Control replies queued to a peer that does not read.",
    ),
    ("--h2-max-settings-per-second", "settings_per_second", int, "SETTINGS frames a second."),
    ("--h2-max-pings-per-second", "pings_per_second", int, "PING frames a second."),
    (
        "--h2-max-resets-per-second",
        "resets_per_second",
        int,
        "RST_STREAM frames and refused streams a second.",
    ),
    (
        "--h2-max-empty-frames-per-second",
        "empty_frames_per_second",
        int,
        "Empty DATA and CONTINUATION frames a second.",
    ),
)


def add_h2_flags(p: argparse._ArgumentGroup) -> None:
    base = Limits()
    for flag, name, convert, text in H2_FLAGS:
        p.add_argument(
            flag, type=typed(convert, name), default=getattr(base, name), help=text + " Not upstream."
        )


def h2_limits(ns: argparse.Namespace) -> Limits:
    values = {name: getattr(ns, flag[2:].replace("-", "_")) for flag, name, _, _ in H2_FLAGS}
    try:
        return Limits(**values)
    except ValueError as exc:
        flag = next((flag for flag, name, _, _ in H2_FLAGS if str(exc).startswith(name)), "--h2-*")
        raise FlagError(f"{flag}: {exc}") from exc
