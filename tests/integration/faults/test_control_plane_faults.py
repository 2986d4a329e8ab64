"""Control-plane faults (issue 12, part 2), injected into real processes: the EPP recovers from each,
and its datastore equals the consistency oracle again, and routing resumes.

Each test has a cluster of its own (`harness.beds.fault_rig.FaultRig`: a minimal plane, a TCP proxy
between the in-process EPP and the API server, a TestBed), because restarting the shared plane would
break every other test of the run. The EPP's watch liveness interval is 2 s there. Convergence is
asserted with generous timeouts; how fast it happens is printed by `benchmarks/bench_control_plane_faults.py`.

What each test proves first, so that "it converged" is not vacuous: the writes made during or after
the fault can reach the EPP only through a new watch (the old ones died with the API server, were
frozen or cut), and the tests that exist for one recovery path check the debug view's counters for
it (`relists` after a 410, `stalledWatches` after a half-open connection).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.beds.fault_rig import FaultRig
from harness.beds.testbed import TestBed

pytestmark = pytest.mark.integration

MODEL = "chat"
# Generous: the machine is shared, and a restarted API server may take a while to be ready.
CONVERGE_TIMEOUT_S = 60.0


@pytest.fixture
def rig() -> Iterator[FaultRig]:
    with FaultRig() as rig:
        yield rig


@pytest.fixture
def rig_without_pod_watch_cache() -> Iterator[FaultRig]:
    """Pods watched straight from etcd: a compaction makes an old resourceVersion answer 410."""
    with FaultRig(apiserver_args=["--watch-cache-sizes=pods#0"]) as rig:
        yield rig


def serving(bed: TestBed, *pods: str) -> None:
    """The EPP running, the pool, a model and `pods`, consistent with the API server."""
    bed.start_epp()
    bed.apply_pool()
    bed.apply_model(MODEL, criticality="Critical")
    for name in pods:
        bed.add_pod(name)
    bed.eventually_consistent(timeout=CONVERGE_TIMEOUT_S)


def change_pods(bed: TestBed) -> set[str]:
    """One of each kind of pod change (new, unready, deleted); the pods that stay routable."""
    bed.add_pod("p3")
    bed.pod_unready("p0")
    bed.delete_pod("p1")
    return {"p2", "p3"}


def converged_and_routing(bed: TestBed, routable: set[str]) -> None:
    verdict = bed.eventually_consistent(timeout=CONVERGE_TIMEOUT_S)
    assert set(bed.datastore_pods()) == routable, verdict.summary()
    assert {bed.routed_pod(MODEL) for _ in range(8)} <= routable


def watch_figure(bed: TestBed, kind: str, figure: str) -> int:
    """A number the EPP's debug view reports for its watch of `kind` (e.g. pods, relists)."""
    return int(bed.view()["watches"][kind][figure])


def test_api_server_restart(rig: FaultRig) -> None:
    bed = rig.bed
    serving(bed, "p0", "p1", "p2")

    rig.plane.restart_apiserver()
    routable = change_pods(bed)

    converged_and_routing(bed, routable)


def test_etcd_restart_with_its_data(rig: FaultRig) -> None:
    bed = rig.bed
    serving(bed, "p0", "p1", "p2")

    rig.plane.restart_etcd()
    routable = change_pods(bed)

    converged_and_routing(bed, routable)
    assert bed.kube.pools.list(bed.namespace), "etcd came back with its data: the pool is still there"


def test_watch_gone_after_compaction_relists_while_pods_change(rig_without_pod_watch_cache: FaultRig) -> None:
    rig = rig_without_pod_watch_cache
    bed = rig.bed
    serving(bed, "p0", "p1", "p2")
    assert rig.proxy is not None
    seen = watch_figure(bed, "pods", "receivedResourceVersion")

    rig.proxy.cut()  # the EPP is partitioned from the API server ...
    routable = change_pods(bed)  # ... while pods change ...
    bed.pod_labels("p2", {"touch": "1"})
    compacted = rig.plane.compact_etcd()  # ... and the history it would resume from goes away.
    assert compacted > seen
    rig.proxy.restore()

    converged_and_routing(bed, routable)
    relists = watch_figure(bed, "pods", "relists")
    assert relists >= 1, "the pod watch resumed without a 410: nothing was tested"


def test_half_open_watch_is_replaced_within_two_bookmark_intervals(rig: FaultRig) -> None:
    bed = rig.bed
    serving(bed, "p0", "p1", "p2")
    assert rig.proxy is not None
    before = rig.proxy.accepted

    frozen = rig.proxy.freeze()  # every open connection stops forwarding and stays open
    assert frozen >= 1
    routable = change_pods(bed)

    converged_and_routing(bed, routable)
    stalled = sum(
        watch_figure(bed, kind, "stalledWatches")
        for kind in ("inferencepools", *bed.cluster.generation.model_plurals, "pods")
    )
    assert stalled >= 1, "no watch was replaced as dead: the freeze caught none"
    assert rig.proxy.accepted > before, "the EPP reconnected through the proxy"
