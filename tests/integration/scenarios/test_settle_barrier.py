"""The settle barrier, proven on a real API server and a real (deliberately slowed) EPP.

A delay alone never makes a correct EPP wrong, so the proof pairs it with a planted defect that shows
only once the delayed handler has run: the pod reconcile waits (500 ms; for the unready pod, until the
test opens a gate, so no wall-clock race decides which look comes first), then adds pods whether or
not they are Ready. The negative check "an unready pod is not routed" then

* passes without the barrier — vacuously: the EPP has not handled the pod yet;
* fails with the barrier — the EPP has applied the write, and the defect is there to see.

That difference is the point: without the barrier, a suite of negative checks stays green on an EPP
that routes to unready pods. The control case shows the barrier is not a false alarm: the same delay
without the defect passes the same check after settling, and a Ready pod added to it is present the
moment `settled()` returns, with no polling.

A reconcile that fails is not applied either: `test_settled_waits_out_a_failed_reconcile_...` makes the
pod reconcile fail a few times once the pod is Ready (the retry backoff keeps the key "retrying"
between attempts) and checks that `settled()` returns only once the retry has succeeded.

The slow and broken reconciles go in through the controllers' constructor (`Reconcilers`); the
product code has no test branch.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient

from epp.api import NamespacedName, ObjectReader
from epp.controller import PodReconciler
from epp.k8s.controllers import Reconcile, ReconcilerFactory, Reconcilers
from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ClusterAccess
from harness.stress.planted import PodRewritingReader, always_ready
from harness.verdicts.settle import PODS, revision

from .support import serving

pytestmark = pytest.mark.integration

DELAY_S = 0.5
UNREADY = "unready"
FLAKY = "flaky"
# Retried after about 0.05, 0.1, 0.2 and 0.4 s (the queue's default backoff): ~0.75 s of "retrying".
FAILURES = 4


class Gate:
    """Opened from the test's thread, awaited on the EPP's loop (which is another thread's)."""

    def __init__(self, *, opened: bool = False) -> None:
        self._lock = threading.Lock()
        self._opened = opened
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def wait(self) -> None:
        with self._lock:
            if self._opened:
                return
            event = asyncio.Event()
            self._waiters.append((asyncio.get_running_loop(), event))
        await event.wait()

    def open(self) -> None:
        with self._lock:
            self._opened = True
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)


def delayed(reconcile: Callable[[NamespacedName], None], unready_gate: Gate) -> Reconcile:
    """Holds its key for DELAY_S first (in flight, so the EPP is not idle), and the unready pod's key
    until the test opens `unready_gate` as well, then reconciles."""

    async def later(key: NamespacedName) -> None:
        await asyncio.sleep(DELAY_S)
        if key.name == UNREADY:
            await unready_gate.wait()
        reconcile(key)

    return later


def delayed_pods(*, readiness_blind: bool, unready_gate: Gate) -> ReconcilerFactory:
    """The pod reconcile, delayed, and readiness-blind if asked (the store is the EPP's, as wired)."""
    return lambda reader, store, pool: delayed(
        PodReconciler(
            PodRewritingReader(reader, always_ready) if readiness_blind else reader, store
        ).reconcile,
        unready_gate,
    )


class FailingWhileReady:
    """The pod reconcile, except that it raises the first `failures` times it finds FLAKY Ready."""

    def __init__(self, failures: int) -> None:
        self.left = failures

    def factory(self) -> ReconcilerFactory:
        """The EPP's wiring hands the factory its own store (never named here: state goes in
        through the API only)."""
        return lambda reader, store, pool: self._wrap(reader, PodReconciler(reader, store).reconcile)

    def _wrap(self, reader: ObjectReader, real: Callable[[NamespacedName], None]) -> Reconcile:
        def reconcile(key: NamespacedName) -> None:
            pod = reader.get_pod(key)
            if key.name == FLAKY and pod is not None and pod.ready and self.left > 0:
                self.left -= 1
                raise RuntimeError(f"planted: reconcile of {key} failed ({self.left} failures left)")
            real(key)

        return reconcile


@pytest.fixture
def slow_bed(
    control_plane: ClusterAccess, kube_api: ApiClient, namespace: str
) -> Iterator[Callable[..., TestBed]]:
    beds: list[TestBed] = []

    def make(
        *,
        readiness_blind: bool = False,
        unready_gate: Gate | None = None,
        pods: ReconcilerFactory | None = None,
    ) -> TestBed:
        gate = unready_gate or Gate(opened=True)
        pods = pods or delayed_pods(readiness_blind=readiness_blind, unready_gate=gate)
        bed = TestBed(kube_api, namespace, control_plane.kubeconfig_path, reconcilers=Reconcilers(pod=pods))
        beds.append(bed)
        return bed

    try:
        yield make
    finally:
        for bed in beds:
            bed.close()


def unready_pod_not_routed(view: dict[str, Any]) -> None:
    """The negative check under test."""
    routed = [p["name"] for p in view["pods"]]
    assert UNREADY not in routed, f"the unready pod is routed: datastore holds {routed}"


def applied_the_pod_write(bed: TestBed, view: dict[str, Any]) -> bool:
    """Had this view applied the bed's latest pod write, and was the EPP idle?"""
    pods = view["watches"][PODS]
    written = bed.settle_barrier.targets(view["watches"])[PODS]
    return bool(pods["idle"]) and revision(pods["appliedResourceVersion"]) >= written


def test_the_barrier_exposes_a_defect_that_a_delayed_pod_handler_hides(
    slow_bed: Callable[..., TestBed],
) -> None:
    """Same EPP, same write, same check: passes unsettled, fails settled. The difference is the point."""
    gate = Gate()
    bed = slow_bed(readiness_blind=True, unready_gate=gate)
    serving(bed, "p1")

    bed.cluster.add_pods([bed.cluster.pod_body(UNREADY, ready=False)], ready=False, listening=False)

    # Without the barrier: the check passes, on a view that has not applied the write (vacuous). The
    # handler holds the pod's key until the gate opens, so this look comes first however slow the box
    # (a 500 ms delay alone lost that race once in CI).
    unsettled = bed.view()
    unready_pod_not_routed(unsettled)
    assert not applied_the_pod_write(bed, unsettled)
    gate.open()

    # With the barrier: the same check on a view that has applied it finds the defect.
    settled = bed.settled()
    assert applied_the_pod_write(bed, settled)
    with pytest.raises(AssertionError, match="the unready pod is routed"):
        unready_pod_not_routed(settled)
    with pytest.raises(AssertionError, match=f"pod .*/{UNREADY}: expected absent"):
        bed.eventually_consistent(timeout=1)  # the oracle agrees: the datastore is wrong


def test_a_delay_alone_is_not_a_defect_and_the_barrier_waits_it_out(slow_bed: Callable[..., TestBed]) -> None:
    bed = slow_bed(readiness_blind=False)
    serving(bed, "p1")

    bed.add_pod(UNREADY, ready=False)
    unready_pod_not_routed(bed.settled())
    bed.eventually_consistent()

    bed.add_pod("p2")
    assert "p2" in {p["name"] for p in bed.settled()["pods"]}, "settled, so no polling is needed"


def test_settled_waits_out_a_failed_reconcile_waiting_to_be_retried(slow_bed: Callable[..., TestBed]) -> None:
    """A failed reconcile has not applied its write: while its key waits out the retry backoff the
    EPP is not idle, so `settled()` returns only after the retry has put the pod in the datastore."""
    flaky = FailingWhileReady(FAILURES)
    bed = slow_bed(pods=flaky.factory())
    serving(bed, "p1")

    bed.add_pod(FLAKY)
    settled = bed.settled()

    routed = [p["name"] for p in settled["pods"]]
    assert FLAKY in routed, f"settled() returned while a failed reconcile was still to be retried: {routed}"
    # (Implied, stated for the reader: the pod gets in only once every planted failure has happened.)
    assert flaky.left == 0
