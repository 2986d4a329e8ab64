"""Fixtures of the routing cases: a test bed holding the upstream hermetic test's objects."""

from __future__ import annotations

import pytest

from harness.testbed import TestBed
from tests.integration.routing import hermetic as objects


@pytest.fixture
def hermetic(testbed: TestBed) -> TestBed:
    return objects.build(testbed)
