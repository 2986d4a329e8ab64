"""What one HTTP/2 server grants and accepts: a frozen settings object, defaults as named constants.

The defaults are generous for Envoy (one connection per Envoy worker, every ext_proc stream of that
worker multiplexed on it: Envoy honours the advertised stream limit by opening another connection)
and tight for anything else: a peer that needs more than these is not a gateway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from epp.h2 import frames as f

MiB: Final = 1024 * 1024

DEFAULT_MAX_MESSAGE_BYTES: Final = 4 * MiB
DEFAULT_MAX_CONCURRENT_STREAMS: Final = 1000
DEFAULT_STREAM_WINDOW: Final = 256 * 1024
DEFAULT_CONNECTION_WINDOW: Final = 16 * MiB
# No larger than a fresh stream window: a frame of the advertised size always fits one (h2spec's
# 4.2/1 sends one without waiting for credit).
DEFAULT_MAX_FRAME_BYTES: Final = DEFAULT_STREAM_WINDOW
DEFAULT_MAX_HEADER_LIST_BYTES: Final = 64 * 1024
DEFAULT_MAX_CONNECTIONS: Final = 1000
DEFAULT_PREFACE_TIMEOUT: Final = 10.0
DEFAULT_HEADER_TIMEOUT: Final = 10.0
DEFAULT_IDLE_TIMEOUT: Final = 300.0
DEFAULT_MAX_CONTINUATION_FRAMES: Final = 16
# Go's net/http2 allows 10,000 control frames queued behind a peer that does not read.
DEFAULT_MAX_QUEUED_CONTROL_FRAMES: Final = 10_000
DEFAULT_SETTINGS_PER_SECOND: Final = 10
DEFAULT_PINGS_PER_SECOND: Final = 100
DEFAULT_RESETS_PER_SECOND: Final = 1000
DEFAULT_EMPTY_FRAMES_PER_SECOND: Final = 100
DEFAULT_WRITE_BUFFER_HIGH: Final = 1 * MiB
DEFAULT_CLOSED_STREAMS_REMEMBERED: Final = 1024
WAITING_STREAM_WINDOWS: Final = 8
"""Incomplete messages waiting for a reservation may hold this many stream windows in all."""
GOAWAY_GRACE: Final = 1.0
"""Seconds between the two GOAWAYs of an idle close: streams the peer opened meanwhile are served."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Everything the server enforces per connection (the connection cap is the server's).

    Windows: the peer gets ``stream_window`` per stream (SETTINGS_INITIAL_WINDOW_SIZE) and
    ``effective_connection_window`` in all; both are topped up only as the bytes are consumed (see
    ``epp.h2.flow``), so what a connection holds of the peer's data never exceeds its window. An
    incomplete message reserves its declared length out of ``reservation_budget`` (its stream window
    is widened to fit it); messages waiting for a reservation stay within their stream windows and
    ``waiting_bytes`` in all (past it the stream adding more ends RESOURCE_EXHAUSTED). Rates are per
    second with a burst of one second's worth; a peer over one gets GOAWAY ENHANCE_YOUR_CALM.
    Timeouts are seconds; 0 turns one off.
    """

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS
    stream_window: int = DEFAULT_STREAM_WINDOW
    connection_window: int = DEFAULT_CONNECTION_WINDOW
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_header_list_bytes: int = DEFAULT_MAX_HEADER_LIST_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    preface_timeout: float = DEFAULT_PREFACE_TIMEOUT
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_continuation_frames: int = DEFAULT_MAX_CONTINUATION_FRAMES
    max_queued_control_frames: int = DEFAULT_MAX_QUEUED_CONTROL_FRAMES
    settings_per_second: int = DEFAULT_SETTINGS_PER_SECOND
    pings_per_second: int = DEFAULT_PINGS_PER_SECOND
    resets_per_second: int = DEFAULT_RESETS_PER_SECOND
    empty_frames_per_second: int = DEFAULT_EMPTY_FRAMES_PER_SECOND
    write_buffer_high: int = DEFAULT_WRITE_BUFFER_HIGH
    closed_streams_remembered: int = DEFAULT_CLOSED_STREAMS_REMEMBERED

    def __post_init__(self) -> None:
        for name in (
            "max_message_bytes",
            "max_concurrent_streams",
            "max_connections",
            "max_continuation_frames",
            "max_queued_control_frames",
            "settings_per_second",
            "pings_per_second",
            "resets_per_second",
            "empty_frames_per_second",
            "write_buffer_high",
            "closed_streams_remembered",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be 1 or more, not {getattr(self, name)}")
        for name in ("stream_window", "connection_window"):
            if not f.DEFAULT_WINDOW <= getattr(self, name) <= f.MAX_WINDOW:
                raise ValueError(f"{name} must be between 65535 and 2^31-1, not {getattr(self, name)}")
        if not f.DEFAULT_MAX_FRAME <= self.max_frame_bytes <= f.MAX_FRAME_LIMIT:
            raise ValueError(f"max_frame_bytes must be between 16384 and 2^24-1, not {self.max_frame_bytes}")
        for name in ("preface_timeout", "header_timeout", "idle_timeout"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be 0 or more, not {getattr(self, name)}")

    @property
    def waiting_bytes(self) -> int:
        """Incomplete messages without a reservation a connection holds at most, in all."""
        return WAITING_STREAM_WINDOWS * self.stream_window

    @property
    def effective_connection_window(self) -> int:
        """``connection_window``, raised to hold a largest message, ``waiting_bytes`` and a frame:
        the most a connection ever holds of the peer's data (19.25 MiB with the EPP's defaults)."""
        needed = self.max_message_bytes + 5 + self.waiting_bytes + self.max_frame_bytes
        return min(f.MAX_WINDOW, max(self.connection_window, needed))

    @property
    def reservation_budget(self) -> int:
        """What incomplete messages may reserve at once: the window less what waits and a frame (at
        least one largest message; a reservation is granted whenever none is held)."""
        return max(0, self.effective_connection_window - self.waiting_bytes - self.max_frame_bytes)
