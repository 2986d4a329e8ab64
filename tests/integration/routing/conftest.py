"""Fixtures of the routing cases: a test bed holding the upstream hermetic test's objects."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import ApiClient

from harness.controlplane import ClusterAccess
from harness.testbed import TestBed
from tests.integration.routing import hermetic as objects

STALENESS = 60.0
"""Seconds. These cases are about the filter tree, not staleness (test_staleness.py covers that):
with the default 2 s, a scrape held up by a starved 2-core box made a pod non-fresh between
``load()`` and the route, and the tree then ran without it."""


@pytest.fixture
def hermetic(control_plane: ClusterAccess, kube_api: ApiClient, namespace: str) -> Iterator[TestBed]:
    bed = TestBed(kube_api, namespace, Path(control_plane.kubeconfig_path), staleness_threshold=STALENESS)
    try:
        yield objects.build(bed)
    finally:
        bed.close()
