"""Stale metrics are not evidence of an idle pod (scheduler docstring; upstream #336, epp-behaviour.md §9.24).

A pod whose model server stops answering /metrics keeps its last (idle-looking) numbers in the
datastore; once they are older than the staleness threshold it must not win over a fresh busy pod.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from harness.beds.testbed import TestBed

STALENESS = 1.0  # seconds; the prober refreshes every 0.05 s, so a live pod is never this old
IDLE: dict[str, Any] = {"waiting": 0, "kv_cache": 0.0}
BUSY: dict[str, Any] = {"waiting": 50, "kv_cache": 0.7}
ROUTES = 10


@pytest.fixture
def bed(testbed_with: Callable[..., TestBed]) -> TestBed:
    return testbed_with(staleness_threshold=STALENESS)


def test_stale_metrics_are_not_treated_as_idle(bed: TestBed) -> None:
    bed.start_epp()
    bed.eventually_consistent()
    bed.apply_pool()
    bed.eventually_consistent()
    bed.apply_model("chat", criticality="Critical")
    bed.eventually_consistent()
    bed.apply_model("batch", criticality="Sheddable")
    bed.eventually_consistent()
    bed.add_pod("idle")
    bed.eventually_consistent()
    bed.add_pod("busy")
    bed.eventually_consistent()
    bed.set_gauges("idle", **IDLE)
    bed.set_gauges("busy", **BUSY)
    bed.eventually_gauges("idle", **IDLE)
    bed.eventually_gauges("busy", **BUSY)
    assert {bed.routed_pod("chat") for _ in range(ROUTES)} == {"idle"}, "fresh and idle: it wins"

    bed.pod_stop_serving("idle")  # no API event: the pod stays Ready, only its scrapes fail
    bed.eventually_consistent()
    stale = bed.eventually_stale("idle")
    assert stale["metrics"]["waitingQueueSize"] == 0, "its last numbers still look idle"
    assert {bed.routed_pod("chat") for _ in range(ROUTES)} == {"busy"}
    # A sheddable request is shed by the fresh pod's load, whatever the stale pod last reported.
    result = bed.route("batch")
    assert result.status == 429, result

    bed.pod_stop_serving("busy")  # no fresh pod at all
    bed.eventually_consistent()
    bed.eventually_stale("busy")
    assert bed.routed_pod("chat") in {"idle", "busy"}, "Critical traffic is still served"
    result = bed.route("batch")
    assert result.status == 429, result
    assert "fresh metrics" in result.message
