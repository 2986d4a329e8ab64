"""Which pod the filter tree picks, through the real ext_proc server (epp-behaviour.md §5.3, §8.2 cases).

Gauges are served by each pod's simulator and reach the EPP by scraping; every case waits until the
datastore view shows them before routing. LoRA cases pin `max_lora=2` so that a pod with two adapters
loaded has no free slot, which makes the soft-affinity draw deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from harness.beds.testbed import TestBed
from tests.integration.routing.hermetic import (
    MY_MODEL,
    MY_MODEL_TARGET,
    SHEDDABLE,
    SHEDDABLE_TARGET,
    SQL_LORA,
    SQL_LORA_TARGET,
    load,
)

ROUTES_PER_CASE = 5  # the same answer every time: no case depends on a random draw


def pod(waiting: int, kv_cache: float, *loras: str) -> dict[str, Any]:
    gauges: dict[str, Any] = {"waiting": waiting, "kv_cache": kv_cache}
    if loras:
        gauges.update(running_loras=list(loras), max_lora=2)
    return gauges


@dataclass(frozen=True)
class Case:
    model: str
    pods: tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]]
    want_pod: str | None  # None: rejected with want_status
    want_target: str = ""
    want_status: int = 200
    chunks: int = 1


# Only pod-0 has room for a sheddable request (queue <= 5 and KV <= 0.8).
ONE_SERVER_WITH_CAPACITY = (
    pod(4, 0.2, "foo", "bar", SHEDDABLE_TARGET),
    pod(0, 0.85, "foo", SHEDDABLE_TARGET),
    pod(10, 0.9, "foo", SHEDDABLE_TARGET),
)

CASES = [
    pytest.param(
        Case(MY_MODEL, (pod(3, 0.2), pod(0, 0.1), pod(10, 0.2)), "pod-1", MY_MODEL_TARGET),
        id="lowest-queue-and-kv-no-lora",
    ),
    pytest.param(
        Case(
            SQL_LORA,
            (pod(0, 0.2, "foo", "bar"), pod(0, 0.1, "foo", SQL_LORA_TARGET), pod(10, 0.2, "foo", "bar")),
            "pod-1",
            SQL_LORA_TARGET,
        ),
        id="active-lora-low-queue",
    ),
    pytest.param(
        Case(
            SQL_LORA,
            (pod(10, 0.2, "foo", "bar"), pod(200, 0.1, "foo", SQL_LORA_TARGET), pod(6, 0.2, "foo")),
            "pod-2",
            SQL_LORA_TARGET,
        ),
        id="avoid-excessive-queue-despite-affinity",
    ),
    pytest.param(
        Case(
            SHEDDABLE,
            (
                pod(6, 0.2, "foo", "bar", SHEDDABLE_TARGET),
                pod(0, 0.85, "foo", SHEDDABLE_TARGET),
                pod(10, 0.9, "foo", SHEDDABLE_TARGET),
            ),
            None,
            want_status=429,
        ),
        id="sheddable-all-past-thresholds-dropped",
    ),
    pytest.param(
        Case(
            SHEDDABLE,
            ONE_SERVER_WITH_CAPACITY,
            "pod-0",
            SHEDDABLE_TARGET,
        ),
        id="sheddable-one-server-with-capacity",
    ),
    pytest.param(
        Case(
            SHEDDABLE,
            ONE_SERVER_WITH_CAPACITY,
            "pod-0",
            SHEDDABLE_TARGET,
            chunks=3,
        ),
        id="body-split-across-chunks",
    ),
]


def datastore_summary(bed: TestBed) -> str:
    """The datastore view, one short line per pod. A string on purpose: pytest cuts a non-string
    assertion message to 240 characters from both ends, which once showed pod-2's gauges right
    after pod-0's name."""
    lines = []
    for p in bed.view()["pods"]:
        m, age = p["metrics"], p["metricsAgeSeconds"]
        lines.append(
            f"{p['name']} {p['address']}: waiting={m['waitingQueueSize']} kv={m['kvCacheUsagePercent']}"
            f" loras={m['activeModels']} inFlight={p['inFlight']}"
            f" age={'never' if age is None else f'{age:.2f}s'}"
        )
    return "datastore: " + "; ".join(lines)


@pytest.mark.parametrize("case", CASES)
def test_routing_picks_the_expected_pod(hermetic: TestBed, case: Case) -> None:
    load(hermetic, case.pods)
    for i in range(ROUTES_PER_CASE):
        result = hermetic.route(case.model, prompt=f"test{i}", chunks=case.chunks)
        if case.want_pod is None:
            assert result.status == case.want_status, result
            assert json.loads(result.error_body)["error"]["code"] == case.want_status
            continue
        assert result.status == 200, result.message
        assert result.endpoint == result.header_endpoint
        assert hermetic.pod_for_endpoint(result.endpoint) == case.want_pod, (
            f"request {i}: {datastore_summary(hermetic)}"
        )
        assert result.endpoint == f"{hermetic.pods[case.want_pod].ip}:8000"
        assert result.body is not None
        sent = json.loads(result.body)
        assert sent == {"model": case.want_target, "prompt": f"test{i}", "max_tokens": 4}
