"""Which resourceVersion each kind of write makes, on the real kube-apiserver: the settle barrier's facts.

The barrier waits until the EPP has applied "the test's latest write", known from the write's answer.
That is only sound if the revision in the answer is the one the EPP's watch delivers. Pinned here,
each against a watch of the same object:

* create / patch / status patch: the answer carries the event's revision;
* DELETE of a pod that goes at once: the answer is the deleted pod, stamped with the DELETED event's
  revision (kube-apiserver's etcd3 store decodes the deleted object at the delete's revision);
* DELETE of a custom resource that goes at once: the server answers with a Status only, so
  `harness.cluster.kube` reads the revision from a watch and returns the object stamped with it;
* DELETE held by a finalizer: the answer is the terminating object, at the revision of that update;
* removing the last finalizer of a terminating object deletes it in a second step: the server's
  answer carries the revision *before* the deletion, so `harness.cluster.kube` reads the DELETED event's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from harness.cluster.builders import HOLD_FINALIZER, ModelBuilder, PodBuilder
from harness.cluster.crds import CRD_GROUP, CRD_VERSION, MODEL_PLURAL
from harness.cluster.kube import Kube, response_json
from harness.verdicts.settle import revision

# v0.3.0's CRD schema and kinds (InferenceModel): not applicable on v1 CRDs.
pytestmark = [pytest.mark.integration, pytest.mark.api_generation("v1alpha2")]

JsonObject = dict[str, Any]
ListFn = Callable[..., Any]
WATCH_TIMEOUT_S = 30  # the server ends the watch after this; bounds the read loop


def events(list_fn: ListFn, name: str, since: int, count: int) -> list[tuple[str, int]]:
    """(type, revision) of the first `count` events of object `name` after revision `since`."""
    response = list_fn(
        watch=True,
        field_selector=f"metadata.name={name}",
        resource_version=str(since),
        timeout_seconds=WATCH_TIMEOUT_S,
        _preload_content=False,
    )
    seen: list[tuple[str, int]] = []
    try:
        pending = b""
        for chunk in response.stream(amt=None, decode_content=False):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in filter(None, lines):
                event = json.loads(line)
                seen.append((str(event["type"]), rv(event["object"])))
                if len(seen) == count:
                    return seen
    finally:
        response.close()  # mid-stream: the connection cannot be reused, only closed
        response.release_conn()
    raise AssertionError(f"the watch ended after {seen}, expected {count} events")


def rv(obj: JsonObject) -> int:
    return revision(obj["metadata"]["resourceVersion"])


def pods_of(api: ApiClient, namespace: str) -> ListFn:
    core = client.CoreV1Api(api)
    return lambda **kw: core.list_namespaced_pod(namespace, **kw)


def models_of(api: ApiClient, namespace: str) -> ListFn:
    custom = client.CustomObjectsApi(api)
    return lambda **kw: custom.list_namespaced_custom_object(
        CRD_GROUP, CRD_VERSION, namespace, MODEL_PLURAL, **kw
    )


class Recorder:
    """The `on_write` observer: what the settle barrier would be told."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, int]] = []

    def __call__(self, plural: str, obj: JsonObject) -> None:
        self.writes.append((plural, rv(obj)))


def test_create_patch_and_status_patch_answer_with_their_event_revision(
    kube_api: ApiClient, namespace: str
) -> None:
    recorder = Recorder()
    kube = Kube(kube_api, on_write=recorder)
    since = rv(kube.pods.list_raw(namespace))
    created = kube.pods.create(namespace, PodBuilder("p1").build())
    labelled = kube.pods.patch(namespace, "p1", {"metadata": {"labels": {"a": "b"}}})
    status = kube.pods.patch_status(namespace, "p1", {"status": {"podIP": "127.0.0.9"}})

    assert events(pods_of(kube_api, namespace), "p1", since, 3) == [
        ("ADDED", rv(created)),
        ("MODIFIED", rv(labelled)),
        ("MODIFIED", rv(status)),
    ]
    assert recorder.writes == [("pods", rv(created)), ("pods", rv(labelled)), ("pods", rv(status))]


def test_a_pod_deleted_at_once_answers_with_the_deleted_event_revision(
    kube_api: ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    created = Kube(kube_api).pods.create(namespace, PodBuilder("p1").build())

    answer = response_json(core.delete_namespaced_pod("p1", namespace, _preload_content=False))

    assert answer["kind"] == "Pod"
    seen = events(pods_of(kube_api, namespace), "p1", rv(created), 2)
    # Unscheduled, so no grace: the deletionTimestamp update and the removal follow each other.
    assert [kind for kind, _ in seen] == ["MODIFIED", "DELETED"]
    assert seen[-1] == ("DELETED", rv(answer))


def test_a_custom_resource_deleted_at_once_answers_with_a_status_and_kube_finds_the_revision(
    kube_api: ApiClient, namespace: str
) -> None:
    custom = client.CustomObjectsApi(kube_api)
    recorder = Recorder()
    kube = Kube(kube_api, on_write=recorder)
    model = ModelBuilder("m1").model_name("x").pool("pool").build()

    first = kube.models.create(namespace, model)
    raw = response_json(
        custom.delete_namespaced_custom_object(
            CRD_GROUP, CRD_VERSION, namespace, MODEL_PLURAL, "m1", _preload_content=False
        )
    )
    assert raw["kind"] == "Status", "the server's answer names no revision: why kube.py watches"
    assert "resourceVersion" not in (raw.get("metadata") or {})

    second = kube.models.create(namespace, model)
    deleted = kube.models.delete(namespace, "m1")

    assert events(models_of(kube_api, namespace), "m1", rv(second), 1) == [("DELETED", rv(deleted))]
    assert rv(deleted) > rv(second) > rv(first)
    assert deleted["metadata"]["name"] == "m1"
    assert recorder.writes[-1] == ("inferencemodels", rv(deleted))


def test_a_held_delete_answers_with_the_update_revision_and_the_release_with_the_deletion(
    kube_api: ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    recorder = Recorder()
    kube = Kube(kube_api, on_write=recorder)
    kube.pods.create(namespace, PodBuilder("p1").build())
    held = kube.pods.patch(namespace, "p1", {"metadata": {"finalizers": [HOLD_FINALIZER]}})

    terminating = kube.pods.delete(namespace, "p1")
    # What the server answers to the write that removes the last finalizer (kept to compare) ...
    raw = response_json(
        core.patch_namespaced_pod(
            "p1",
            namespace,
            {"metadata": {"finalizers": None}},
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )
    )

    seen = events(pods_of(kube_api, namespace), "p1", rv(held), 2)
    assert seen == [("MODIFIED", rv(terminating)), ("DELETED", seen[1][1])]
    assert terminating["metadata"].get("deletionTimestamp")
    assert rv(raw) == rv(terminating) < seen[1][1], "the answer predates the deletion it caused"

    # ... and what `harness.cluster.kube` returns for the same write: the deletion's own revision.
    kube.pods.create(namespace, PodBuilder("p2").build())
    kube.pods.patch(namespace, "p2", {"metadata": {"finalizers": [HOLD_FINALIZER]}})
    terminating = kube.pods.delete(namespace, "p2")
    released = kube.pods.patch(namespace, "p2", {"metadata": {"finalizers": None}})

    assert events(pods_of(kube_api, namespace), "p2", rv(terminating), 1) == [("DELETED", rv(released))]
    assert recorder.writes[-1] == ("pods", rv(released))
