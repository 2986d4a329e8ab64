"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ClusterAccess


@pytest.fixture
def testbed_with(
    control_plane: ClusterAccess, kube_api: ApiClient, namespace: str
) -> Iterator[Callable[..., TestBed]]:
    """``testbed_with(**options)``: the `testbed` fixture's TestBed (the test's namespace) made with
    other `TestBed` options (a shorter or longer staleness threshold, say); closed at teardown."""
    with ExitStack() as beds:

        def make(**options: Any) -> TestBed:
            bed = TestBed(kube_api, namespace, Path(control_plane.kubeconfig_path), **options)
            beds.callback(bed.close)
            return bed

        yield make
