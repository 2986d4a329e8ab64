"""`--h2-*`: the ext_proc port's HTTP/2 limits as flags, their defaults, and values that cannot work."""

from __future__ import annotations

import re

import pytest

from epp.h2 import Limits
from epp.server.flag_values import FlagError
from epp.server.flags import parse_flags


def _base() -> list[str]:
    """The one required flag, under whichever name the parser has (it is being renamed to kebab-case)."""
    for flag in ("--pool-name", "--poolName"):
        try:
            parse_flags([flag, "p"], {})
        except FlagError:
            continue
        return [flag, "p"]
    raise AssertionError("no pool name flag")


def test_the_defaults_are_the_limits_defaults_and_generous_for_envoy() -> None:
    limits = parse_flags(_base(), {}).config.h2
    assert limits == Limits()
    assert limits.max_concurrent_streams >= 1000
    assert limits.connection_window == 16 * 1024 * 1024
    assert limits.stream_window == 256 * 1024


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        pytest.param(["--h2-max-concurrent-streams=2000"], "max_concurrent_streams", 2000, id="streams"),
        pytest.param(["--h2-stream-window", "512Ki"], "stream_window", 512 * 1024, id="stream-window"),
        pytest.param(
            ["--h2-connection-window=64Mi"], "connection_window", 64 * 1024 * 1024, id="connection-window"
        ),
        pytest.param(["--h2-max-connections=10"], "max_connections", 10, id="connections"),
        pytest.param(["--h2-preface-timeout=500ms"], "preface_timeout", 0.5, id="preface-timeout"),
        pytest.param(["--h2-header-timeout=0"], "header_timeout", 0.0, id="header-timeout-off"),
        pytest.param(["--h2-idle-timeout=1m"], "idle_timeout", 60.0, id="idle-timeout"),
        pytest.param(["--h2-max-continuation-frames=4"], "max_continuation_frames", 4, id="continuations"),
        pytest.param(["--h2-max-queued-control-frames=50"], "max_queued_control_frames", 50, id="control"),
        pytest.param(["--h2-max-settings-per-second=3"], "settings_per_second", 3, id="settings"),
        pytest.param(["--h2-max-pings-per-second=7"], "pings_per_second", 7, id="pings"),
        pytest.param(["-h2-max-resets-per-second=9"], "resets_per_second", 9, id="resets-one-dash"),
        pytest.param(["--h2-max-empty-frames-per-second=11"], "empty_frames_per_second", 11, id="empty"),
    ],
)
def test_each_flag_sets_its_limit(argv: list[str], field: str, value: float) -> None:
    limits = parse_flags(_base() + argv, {}).config.h2
    assert getattr(limits, field) == value
    others = {name: getattr(Limits(), name) for name in Limits.__dataclass_fields__ if name != field}
    assert {name: getattr(limits, name) for name in others} == others


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        pytest.param(["--h2-max-concurrent-streams=0"], "--h2-max-concurrent-streams", id="no-streams"),
        pytest.param(["--h2-stream-window=1Ki"], "--h2-stream-window", id="window-under-65535"),
        pytest.param(["--h2-connection-window=4Gi"], "--h2-connection-window", id="window-over-2^31-1"),
        pytest.param(["--h2-idle-timeout=-1s"], "--h2-idle-timeout", id="negative-timeout"),
        pytest.param(["--h2-max-pings-per-second=x"], "--h2-max-pings-per-second", id="not-a-number"),
    ],
)
def test_values_that_cannot_work_are_flag_errors_naming_the_flag(argv: list[str], named: str) -> None:
    with pytest.raises(FlagError, match=re.escape(named)):
        parse_flags(_base() + argv, {})
