"""The forged kubelet's transitions (states kept for reproducing bugs), seen through a real watch on the
API server, in order: Ready flips to False, the IP changes, a deletionTimestamp appears, the pod goes."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client import ApiClient

from harness.cluster.builders import HOLD_FINALIZER, PodBuilder
from harness.cluster.forged import ForgedKubelet
from harness.cluster.kube import Kube

pytestmark = pytest.mark.integration

JsonObject = dict[str, Any]
WATCH_TIMEOUT_S = 30  # the server ends the watch after this; bounds the loop below
Watch: Any = watch.Watch  # the kubernetes watch module is untyped


def is_ready(pod: JsonObject) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pod_ip(pod: JsonObject) -> str | None:
    ip = pod.get("status", {}).get("podIP")
    return str(ip) if ip is not None else None


class PodEvents:
    """One watch on one pod, started from a resourceVersion, read step by step."""

    def __init__(self, api_client: ApiClient, namespace: str, name: str, resource_version: str) -> None:
        self._watch = Watch()
        self._events: Generator[JsonObject, None, None] = self._watch.stream(
            client.CoreV1Api(api_client).list_namespaced_pod,
            namespace=namespace,
            field_selector=f"metadata.name={name}",
            resource_version=resource_version,
            timeout_seconds=WATCH_TIMEOUT_S,
            deserialize=False,
        )
        self.seen: list[tuple[str, JsonObject]] = []

    def next_until(self, what: str, predicate: Callable[[str, JsonObject], bool]) -> JsonObject:
        """Consume events until one satisfies ``predicate``; fail if the watch ends first."""
        for event in self._events:
            kind, obj = str(event["type"]), event["object"]
            self.seen.append((kind, obj))
            if predicate(kind, obj):
                return dict(obj)
        raise AssertionError(f"watch ended before {what}; saw {[k for k, _ in self.seen]}")

    def close(self) -> None:
        self._watch.stop()
        self._events.close()


def test_watch_sees_ready_flip_ip_change_deletion_timestamp_then_deletion(
    kube_api: ApiClient, namespace: str
) -> None:
    kube, kubelet = Kube(kube_api), ForgedKubelet(kube_api)
    started = kubelet.start(namespace, PodBuilder("p1").labels(app="sim").build(), ip="127.0.0.5")
    assert is_ready(started)
    assert pod_ip(started) == "127.0.0.5"
    events = PodEvents(kube_api, namespace, "p1", started["metadata"]["resourceVersion"])
    try:
        kubelet.make_unready(namespace, "p1")
        unready = events.next_until("Ready=False", lambda kind, pod: kind == "MODIFIED" and not is_ready(pod))
        assert pod_ip(unready) == "127.0.0.5", "readiness flip must keep the IP"

        kubelet.change_ip(namespace, "p1", "127.0.0.6")
        moved = events.next_until("the new IP", lambda kind, pod: pod_ip(pod) == "127.0.0.6")
        assert moved["status"]["podIPs"] == [{"ip": "127.0.0.6"}]
        assert not is_ready(moved), "an IP change must keep readiness"

        terminating = kubelet.finalize_and_delete(namespace, "p1")
        assert "deletionTimestamp" in terminating["metadata"]
        marked = events.next_until(
            "a deletionTimestamp", lambda kind, pod: "deletionTimestamp" in pod["metadata"]
        )
        assert marked["metadata"]["finalizers"] == [HOLD_FINALIZER]
        assert kube.pods.get(namespace, "p1")["metadata"]["deletionTimestamp"]

        kubelet.release(namespace, "p1")
        gone = events.next_until("DELETED", lambda kind, pod: kind == "DELETED")
        assert gone["metadata"]["name"] == "p1"
    finally:
        events.close()

    kinds = [kind for kind, _ in events.seen]
    assert kinds[-1] == "DELETED"
    assert "DELETED" not in kinds[:-1]
    assert kube.pods.list(namespace) == []


def test_make_ready_sets_ip_phase_and_conditions_through_status(kube_api: ApiClient, namespace: str) -> None:
    kube, kubelet = Kube(kube_api), ForgedKubelet(kube_api)
    kube.pods.create(namespace, PodBuilder("p1").labels(app="sim").build())
    assert "podIP" not in kube.pods.get(namespace, "p1").get("status", {})

    ready = kubelet.make_ready(namespace, "p1", "127.0.0.9")

    status = ready["status"]
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.0.0.9"
    assert status["podIPs"] == [{"ip": "127.0.0.9"}]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["ContainersReady"]["status"] == "True"
    assert conditions["Ready"]["lastTransitionTime"]
    assert ready["metadata"]["labels"] == {"app": "sim"}


def test_unready_then_ready_again_keeps_ip_and_moves_transition_time_only_on_change(
    kube_api: ApiClient, namespace: str
) -> None:
    kubelet = ForgedKubelet(kube_api)
    first = kubelet.start(namespace, PodBuilder("p1").build(), ip="127.0.0.7")
    scheduled_at = {c["type"]: c for c in first["status"]["conditions"]}["PodScheduled"]["lastTransitionTime"]

    unready = kubelet.make_unready(namespace, "p1")
    again = kubelet.make_ready(namespace, "p1", "127.0.0.7")

    assert pod_ip(unready) == "127.0.0.7"
    assert not is_ready(unready)
    assert is_ready(again)
    assert {c["type"]: c for c in again["status"]["conditions"]}["PodScheduled"][
        "lastTransitionTime"
    ] == scheduled_at


def test_deleting_context_holds_then_releases(kube_api: ApiClient, namespace: str) -> None:
    kube, kubelet = Kube(kube_api), ForgedKubelet(kube_api)
    kubelet.start(namespace, PodBuilder("p1").build(), ip="127.0.0.8")

    with kubelet.deleting(namespace, "p1") as terminating:
        assert terminating["metadata"]["deletionTimestamp"]
        assert [p["metadata"]["name"] for p in kube.pods.list(namespace)] == ["p1"]

    assert kube.pods.list(namespace) == []
    kubelet.release(namespace, "p1")  # idempotent once the pod is gone
