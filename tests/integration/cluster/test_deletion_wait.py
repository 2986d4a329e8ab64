"""Waiting for a graceful deletion that began long ago: `Pods.wait_deleted` from an expired revision.

`Cluster.await_gone` watches for the DELETED event from the revision the delete left the pod at.
The churn machine ends a termination steps after it began, and by then a busy run (`-n 2`, every
worker's pods changing) may have turned over the API server's watch history of pods: the watch is
refused with 410 Expired, and the step failed although nothing was wrong ("passed alone"). Here the
history goes away for certain: a plane of its own serves pods without a watch cache (watched
straight from etcd) and etcd is compacted past the delete's revision.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient

from harness.cluster.builders import HOLD_FINALIZER, PodBuilder
from harness.cluster.controlplane import MINIMAL, ControlPlane
from harness.cluster.kube import Kube
from harness.cluster.namespaces import TEST_LABEL, create_namespace

pytestmark = pytest.mark.integration

NAMESPACE = "deletion-wait"


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with ControlPlane(components=MINIMAL, extra_apiserver_args=["--watch-cache-sizes=pods#0"]) as started:
        yield started


@pytest.fixture
def api(plane: ControlPlane) -> Iterator[ApiClient]:
    api_client = plane.api_client()
    try:
        create_namespace(api_client, NAMESPACE, TEST_LABEL, exist_ok=True)
        yield api_client
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


def terminating_pod(kube: Kube, name: str) -> dict[str, object]:
    """A pod deleted gracefully and held Terminating by a finalizer: the delete's answer."""
    kube.pods.create(NAMESPACE, PodBuilder(name).build())
    kube.pods.patch(NAMESPACE, name, {"metadata": {"finalizers": [HOLD_FINALIZER]}})
    return kube.pods.delete(NAMESPACE, name)


def test_a_deletion_whose_event_has_left_the_watch_history_is_awaited_without_error(
    plane: ControlPlane, api: ApiClient
) -> None:
    kube = Kube(api)
    deleting = terminating_pod(kube, "gone-long-ago")
    kube.pods.patch(NAMESPACE, "gone-long-ago", {"metadata": {"finalizers": None}})  # it goes ...
    kube.pods.create(NAMESPACE, PodBuilder("after-it").build())
    # ... and so does its history: compacted past the deletion's own revision (delete's RV + 1).
    assert plane.compact_etcd() > int(deleting["metadata"]["resourceVersion"]) + 1

    assert kube.pods.wait_deleted(NAMESPACE, deleting, timeout=10) is None, "gone, at a revision lost"


def test_a_pod_still_terminating_is_watched_again_from_now(plane: ControlPlane, api: ApiClient) -> None:
    kube = Kube(api)
    deleting = terminating_pod(kube, "still-terminating")
    for name in ("later", "later-still"):  # history moves on past the delete
        kube.pods.create(NAMESPACE, PodBuilder(name).build())
    assert plane.compact_etcd() > int(deleting["metadata"]["resourceVersion"]) + 1

    # Still there: the wait watches from the current revision and times out like any wait for a
    # deletion that does not come (rather than failing on the expired revision it was given).
    with pytest.raises(TimeoutError, match="no DELETED event for still-terminating"):
        kube.pods.wait_deleted(NAMESPACE, deleting, timeout=1)
