"""Fixtures of the routing cases: a test bed holding the upstream hermetic test's objects."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.beds.testbed import TestBed
from tests.integration.routing import hermetic as objects

STALENESS = 60.0
"""Seconds. These cases are about the filter tree, not staleness (test_staleness.py covers that):
with the default 2 s, a scrape held up by a starved 2-core box made a pod non-fresh between
``load()`` and the route, and the tree then ran without it."""


@pytest.fixture
def hermetic(testbed_with: Callable[..., TestBed]) -> TestBed:
    return objects.build(testbed_with(staleness_threshold=STALENESS))
