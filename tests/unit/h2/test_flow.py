"""`epp.h2.flow.Inbound`: credit is owed as bytes are consumed and given back in one increment once
less than half the window is left to the peer, never before, never more than was consumed."""

from __future__ import annotations

import pytest

from epp.h2.flow import Inbound


def received(window: Inbound, n: int) -> None:
    """What the connection does as DATA arrives: the peer's allowance shrinks."""
    window.available -= n


def test_credit_accumulates_until_half_the_window_is_used_then_comes_back_whole() -> None:
    window = Inbound(100)
    received(window, 30)
    assert window.consume(30) == 0  # 70 left to the peer: no update yet
    assert (window.owed, window.held) == (30, 0)
    received(window, 30)
    assert window.consume(30) == 60  # 40 left: everything owed, in one increment
    assert (window.available, window.owed, window.held) == (100, 0, 0)
    received(window, 60)
    assert window.consume(60) == 60  # the next round starts from nothing owed


@pytest.mark.parametrize(
    ("left", "update"),
    [
        pytest.param(50, False, id="exactly-half-left"),
        pytest.param(49, True, id="just-under-half"),
        pytest.param(40, True, id="under-half-above-a-quarter"),
        pytest.param(70, False, id="over-half"),
    ],
)
def test_an_update_goes_out_only_below_half_the_window(left: int, update: bool) -> None:
    window = Inbound(100)
    received(window, 100 - left)
    assert window.consume(100 - left) == (100 - left if update else 0)


def test_bytes_still_held_are_not_credited() -> None:
    window = Inbound(100)
    received(window, 80)
    assert window.consume(20) == 20  # 60 of the 80 still held: only what was consumed
    assert (window.available, window.held) == (40, 60)


def test_nothing_consumed_sends_nothing_even_with_the_window_low() -> None:
    window = Inbound(100)
    received(window, 90)
    assert window.consume(0) == 0
    assert (window.available, window.owed, window.held) == (10, 0, 90)
