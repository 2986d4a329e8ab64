"""The v1 request protocol's flags: upstream's `--disable-endpoint-subset-filter`, our fallbacks."""

from __future__ import annotations

import pytest

from epp.server.flag_values import FlagError
from epp.server.flags import parse_flags

POOL = ["--poolName", "p"]


@pytest.mark.parametrize(
    ("argv", "subset_filter", "fallbacks"),
    [
        pytest.param([], True, 0, id="defaults-as-upstream"),
        pytest.param(["--disable-endpoint-subset-filter"], False, 0, id="bare-disable"),
        pytest.param(["-disable-endpoint-subset-filter=true"], False, 0, id="disable-true-one-dash"),
        pytest.param(["--disable-endpoint-subset-filter=false"], True, 0, id="disable-false"),
        pytest.param(["--destination-endpoint-fallbacks=2"], True, 2, id="two-fallbacks"),
        pytest.param(["--destination-endpoint-fallbacks", "0"], True, 0, id="no-fallbacks"),
    ],
)
def test_request_protocol_flags(argv: list[str], subset_filter: bool, fallbacks: int) -> None:
    config = parse_flags([*POOL, *argv], {}).config
    assert (config.endpoint_subset_filter, config.destination_fallbacks) == (subset_filter, fallbacks)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        pytest.param(
            ["--destination-endpoint-fallbacks=-1"], "--destination-endpoint-fallbacks", id="negative"
        ),
        pytest.param(["--destination-endpoint-fallbacks=two"], "int", id="not-a-number"),
        pytest.param(["--disable-endpoint-subset-filter=maybe"], "bool", id="not-a-bool"),
    ],
)
def test_bad_request_protocol_flags_are_refused(argv: list[str], named: str) -> None:
    with pytest.raises(FlagError, match=named):
        parse_flags([*POOL, *argv], {})
