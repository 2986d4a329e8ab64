"""Data-plane faults on model servers, through the real EPP (issue 12, part 3).

A model server that dies or hangs is not an API event: the pod may stay Ready in the API while its
server is gone. What stops traffic going there is the staleness rule (a pod whose metrics are older
than `--metricsStalenessThreshold` is not a candidate while a fresh one exists). Each test first
proves the fault took effect inside the EPP (the victim's metrics age past the threshold, while the
datastore still equals the oracle, i.e. still holds the victim), then checks where requests go.

- killed, nobody reports it: a forged pod (no kubelet: a lost node) whose server's listener closes;
  the pod stays Ready in the API. (The node agent, like a kubelet, reports a killed container
  NotReady at once and restarts it, so an agent pod never shows a dead server as Ready for long; that
  path is the last test.)
- black-holed: an agent pod whose simulator accepts connections and never answers `/metrics` or
  generation (sim admin black hole) while `/health` still answers, so the probe keeps it Ready.
  The other pods' scrapes are unaffected: their metrics stay fresh throughout.

Figures (time until no longer routed, failed requests): `benchmarks/bench_model_server_faults.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from harness.base.eventually import eventually
from harness.beds.testbed import TestBed

STALENESS = 2.0  # seconds; scraped every 0.05 s, so a live pod is never this old (generous: a loaded box)
ROUTES = 20
OTHERS = ("p1", "p2")


@pytest.fixture
def bed(testbed_with: Callable[..., TestBed]) -> TestBed:
    return testbed_with(staleness_threshold=STALENESS)


def serving(bed: TestBed, *, forged: bool) -> None:
    bed.start_epp()
    bed.apply_pool()
    bed.apply_model("chat", criticality="Critical")
    for name in ("victim", *OTHERS):
        if forged:
            bed.add_forged_pod(name)
        else:
            bed.add_pod(name)
    bed.eventually_consistent()
    bed.eventually_scraped()


def fresh_ages(bed: TestBed, names: tuple[str, ...]) -> dict[str, float]:
    """The metrics age of each of ``names``; each must be under the staleness threshold."""
    ages = {}
    for name in names:
        pod = bed.pod_view(name)
        assert pod is not None, f"{name} left the datastore"
        age = pod["metricsAgeSeconds"]
        assert age is not None, f"{name}: never scraped"
        assert age < STALENESS, f"{name}: metrics {age:.2f}s old (threshold {STALENESS}s)"
        ages[name] = age
    return ages


def routed_pods(bed: TestBed) -> set[str]:
    return {bed.routed_pod("chat") for _ in range(ROUTES)}


def test_killed_model_server_still_ready_in_the_api_is_not_routed_once_stale(bed: TestBed) -> None:
    serving(bed, forged=True)
    assert "victim" in routed_pods(bed) | routed_pods(bed), "before the fault the victim is a candidate"

    bed.forged_server_dies("victim")  # no API event: the pod stays Ready
    stale = bed.eventually_stale("victim")
    assert stale["address"] == bed.pods["victim"].ip
    verdict = bed.eventually_consistent()
    assert "victim" in {key.split("/")[1] for key in verdict.expected.pods}, "still Ready in the API"
    fresh_ages(bed, OTHERS)
    assert routed_pods(bed) <= set(OTHERS)


def test_black_holed_model_server_is_not_routed_and_other_pods_stay_fresh(bed: TestBed) -> None:
    serving(bed, forged=False)
    assert "victim" in routed_pods(bed) | routed_pods(bed), "before the fault the victim is a candidate"

    bed.pod_stop_serving("victim")  # accepts, never answers /metrics or generation; /health answers
    bed.eventually_stale("victim")  # the fault is in effect inside the EPP
    verdict = bed.eventually_consistent()
    assert "victim" in {key.split("/")[1] for key in verdict.expected.pods}, "still Ready in the API"
    # Over two more thresholds, while every scrape of the victim hangs, the others stay fresh.
    until = time.monotonic() + 2 * STALENESS
    while time.monotonic() < until:
        fresh_ages(bed, OTHERS)
        assert routed_pods(bed) <= set(OTHERS)
    stale = bed.pod_view("victim")
    assert stale is not None
    assert stale["metricsAgeSeconds"] > 2 * STALENESS, "its scrapes still hang"


def test_killed_container_of_an_agent_pod_leaves_through_the_api_and_comes_back(bed: TestBed) -> None:
    """The node agent sees the process exit: NotReady written, the container restarted, Ready again."""
    serving(bed, forged=False)
    old_pid = bed.sim("victim").pid
    bed.kill_container("victim")

    def restarted() -> int:
        pid = bed.sim("victim").pid
        assert pid != old_pid, "not restarted yet"
        return pid

    eventually(restarted, timeout=60, retry_on=(OSError,), message="the agent restarts the simulator")
    bed.eventually_consistent(timeout=60)
    bed.eventually_scraped(timeout=30)
    eventually(lambda: fresh_ages(bed, ("victim", *OTHERS)), timeout=30)
    assert "victim" in bed.datastore_pods()
