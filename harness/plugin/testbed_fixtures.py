"""pytest fixtures for tests that run the EPP against the harness's API server (registered by entry point).

Thin by design (STYLE habit 13): the behaviour lives in `harness.beds.testbed.TestBed`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient

from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ClusterAccess


@pytest.fixture
def testbed(control_plane: ClusterAccess, kube_api: ApiClient, namespace: str) -> Iterator[TestBed]:
    """A TestBed in the test's fresh namespace; the EPP is started by the test (`start_epp()`)."""
    bed = TestBed(kube_api, namespace, control_plane.kubeconfig_path)
    try:
        yield bed
    finally:
        bed.close()
