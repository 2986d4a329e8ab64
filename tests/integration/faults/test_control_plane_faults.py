"""Control-plane faults (issue 12, part 2), injected into real processes: the EPP recovers from each,
and its datastore equals the consistency oracle again, and routing resumes.

Each test has a cluster of its own (`harness.beds.fault_rig.FaultRig`: a minimal plane, a TCP proxy
between the in-process EPP and the API server, a TestBed), because restarting the shared plane would
break every other test of the run. The EPP's watch liveness interval is 2 s there. Convergence is
asserted with generous timeouts; how fast it happens is printed by `benchmarks/bench_control_plane_faults.py`.

What each test proves first, so that "it converged" is not vacuous: the writes made during or after
the fault can reach the EPP only through a new watch (the old ones died with the API server, were
frozen or cut), and the tests that exist for one recovery path check the debug view's counters for
it (`relists` after a 410, `stalledWatches` after a half-open connection, no `relists` where
bookmarks kept a still namespace's watch at a recent version).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from harness.base.eventually import eventually
from harness.beds.fault_rig import FaultRig
from harness.beds.testbed import TestBed
from harness.cluster.builders import PodBuilder
from harness.cluster.kube import PodClient
from harness.cluster.namespaces import TEST_LABEL, create_namespace

pytestmark = pytest.mark.integration

MODEL = "chat"
# Generous: the machine is shared, and a restarted API server may take a while to be ready.
CONVERGE_TIMEOUT_S = 60.0
BOOKMARKED_WATCH_INTERVAL_S = 5.0
# One write every CHURN_PERIOD_S fills kube-apiserver's fresh pod watch cache (100 events) only
# after its 75 s minimum history: it then drops its oldest events instead of doubling.
CHURN_PERIOD_S = 0.85
# The old history leaves the cache after about 90 s of churn; generous for a shared machine.
EVICTION_TIMEOUT_S = 300.0


@pytest.fixture
def rig() -> Iterator[FaultRig]:
    with FaultRig() as rig:
        yield rig


@pytest.fixture
def rig_without_pod_watch_cache() -> Iterator[FaultRig]:
    """Pods watched straight from etcd: a compaction makes an old resourceVersion answer 410."""
    with FaultRig(apiserver_args=["--watch-cache-sizes=pods#0"]) as rig:
        yield rig


@pytest.fixture
def rig_with_bookmarks() -> Iterator[FaultRig]:
    """Watches of 5 to 6 s: kube-apiserver sends a bookmark 2 s before each one ends (the rig's
    2 s watches end before any bookmark is due)."""
    with FaultRig(watch_bookmark_interval=BOOKMARKED_WATCH_INTERVAL_S) as rig:
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

    def replaced() -> None:
        stalled = sum(
            watch_figure(bed, kind, "stalledWatches")
            for kind in ("inferencepools", *bed.cluster.generation.model_plurals, "pods")
        )
        assert stalled >= 1, "no watch was replaced as dead: the freeze caught none"

    # The pods may converge before a frozen watch of another kind is due to be replaced (a watch
    # renewing at the moment of the freeze was not caught): wait for the promise's own bound, two
    # bookmark intervals from the freeze, with slack for a shared machine.
    eventually(replaced, timeout=2 * rig.watch_bookmark_interval + 10.0)
    assert rig.proxy.accepted > before, "the EPP reconnected through the proxy"


def gone_from_watch_cache(api: client.ApiClient, namespace: str, resource_version: str) -> bool:
    """Whether kube-apiserver refuses a pod watch from `resource_version` as too old (410).

    `namespace` must have changed since `resource_version`: a watch it accepts then starts with
    that change, so the answer comes at once either way."""
    response: Any = client.CoreV1Api(api).list_namespaced_pod(
        namespace,
        watch=True,
        resource_version=resource_version,
        timeout_seconds=1,
        _preload_content=False,
    )
    try:
        for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
            event = json.loads(line)
            return bool(event["type"] == "ERROR" and event["object"].get("code") == 410)
        return False
    finally:
        response.release_conn()


class Churn:
    """One write every CHURN_PERIOD_S to a pod the EPP does not watch, paced from the first."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self._pods = PodClient(api)
        self._pods.create(namespace, PodBuilder("churn").build())
        self._began = time.monotonic()
        self.writes = 0

    def next_write(self) -> None:
        time.sleep(max(0.0, self._began + self.writes * CHURN_PERIOD_S - time.monotonic()))
        self.writes += 1
        self._pods.patch(self.namespace, "churn", {"metadata": {"labels": {"n": str(self.writes)}}})


def test_a_watch_renewed_after_its_history_left_the_cache_resumes_from_a_bookmark_without_a_relist(
    rig_with_bookmarks: FaultRig,
) -> None:
    """The EPP's namespace stays still while pods elsewhere keep changing, until kube-apiserver's
    watch cache has dropped every event up to the last change the EPP saw. An EPP that resumes
    from that change gets 410 and lists again; one that took each bookmark's resourceVersion
    renews its watches from a recent one, with no relist."""
    rig = rig_with_bookmarks
    bed = rig.bed
    serving(bed, "p0")
    last_change = max(int(p["metadata"]["resourceVersion"]) for p in bed.kube.pods.list(bed.namespace))
    api = rig.plane.api_client()
    try:
        create_namespace(api, "elsewhere", TEST_LABEL)
        churn = Churn(api, "elsewhere")
        deadline = time.monotonic() + EVICTION_TIMEOUT_S
        while True:
            churn.next_write()
            if gone_from_watch_cache(api, churn.namespace, str(last_change)):
                break
            assert time.monotonic() < deadline, f"resourceVersion {last_change} still in the watch cache"
        evicted_at = churn.writes

        # Now a watch from `last_change` is refused. Keep the cache moving (bookmarks carry its
        # version) until the EPP's pod watch has taken two more bookmarks, so at least one of its
        # watches began after the eviction.
        versions = {watch_figure(bed, "pods", "receivedResourceVersion")}
        deadline = time.monotonic() + 6 * BOOKMARKED_WATCH_INTERVAL_S
        while len(versions) < 3 and watch_figure(bed, "pods", "relists") == 0:
            assert time.monotonic() < deadline, (
                f"the EPP's pod watch took no bookmark in {6 * BOOKMARKED_WATCH_INTERVAL_S:.0f} s: "
                f"versions seen {sorted(versions)}, the last change in its namespace {last_change}"
            )
            churn.next_write()
            versions.add(watch_figure(bed, "pods", "receivedResourceVersion"))
    finally:
        api.close()  # type: ignore[no-untyped-call]

    relists = watch_figure(bed, "pods", "relists")
    assert relists == 0, (
        f"the pod watch resumed from its last change ({last_change}), gone from the watch cache after "
        f"{evicted_at} writes elsewhere, and relisted {relists} time(s): bookmarks did not move it on"
    )
    assert max(versions) > last_change
