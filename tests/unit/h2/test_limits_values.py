"""`Limits` refuses values that cannot work, with a message naming the field, its range and the
value given; the edges of each range are accepted."""

from __future__ import annotations

import re

import pytest

from epp.h2 import Limits
from epp.h2 import frames as f


@pytest.mark.parametrize(
    "edge",
    [
        pytest.param({"stream_window": f.DEFAULT_WINDOW}, id="stream-window-least"),
        pytest.param({"stream_window": f.MAX_WINDOW}, id="stream-window-most"),
        pytest.param({"connection_window": f.MAX_WINDOW}, id="connection-window-most"),
        pytest.param({"max_frame_bytes": f.DEFAULT_MAX_FRAME}, id="frame-least"),
        pytest.param({"max_frame_bytes": f.MAX_FRAME_LIMIT}, id="frame-most"),
        pytest.param({"idle_timeout": 0.0}, id="timeout-off"),
        pytest.param({"max_concurrent_streams": 1}, id="one-stream"),
    ],
)
def test_the_edges_of_each_range_are_accepted(edge: dict[str, float]) -> None:
    limits = Limits(**edge)
    assert {name: getattr(limits, name) for name in edge} == edge


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(
            {"max_concurrent_streams": 0}, "max_concurrent_streams must be 1 or more, not 0", id="streams"
        ),
        pytest.param(
            {"stream_window": f.DEFAULT_WINDOW - 1},
            "stream_window must be between 65535 and 2^31-1, not 65534",
            id="stream-window-under",
        ),
        pytest.param(
            {"connection_window": f.MAX_WINDOW + 1},
            "connection_window must be between 65535 and 2^31-1, not 2147483648",
            id="connection-window-over",
        ),
        pytest.param(
            {"max_frame_bytes": f.MAX_FRAME_LIMIT + 1},
            "max_frame_bytes must be between 16384 and 2^24-1, not 16777216",
            id="frame-over",
        ),
        pytest.param(
            {"max_frame_bytes": f.DEFAULT_MAX_FRAME - 1},
            "max_frame_bytes must be between 16384 and 2^24-1, not 16383",
            id="frame-under",
        ),
        pytest.param({"header_timeout": -0.5}, "header_timeout must be 0 or more, not -0.5", id="timeout"),
        pytest.param(
            {"idle_timeout": float("nan")}, "idle_timeout must be 0 or more, not nan", id="timeout-nan"
        ),
    ],
)
def test_a_value_that_cannot_work_is_refused_naming_the_field_its_range_and_the_value(
    value: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Limits(**value)
