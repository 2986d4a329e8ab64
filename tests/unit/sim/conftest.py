from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.base.addresses import AddressPool


@pytest.fixture
def address() -> Iterator[str]:
    """A loopback address of our own (127.0.x.y), so port 8000 is free whatever else runs."""
    with AddressPool() as pool:
        yield pool.acquire()


@pytest.fixture
def addresses() -> Iterator[AddressPool]:
    with AddressPool() as pool:
        yield pool
