"""Thin typed helpers over the ``kubernetes`` client, shared by tests and the CLI.

Everything goes in and comes out as API JSON (``dict[str, Any]`` with the API's camelCase keys),
the same shape ``harness.cluster.builders`` produces and the EPP parses; no generated model classes leak out.

    kube = Kube(api_client)
    kube.pools.create(ns, PoolBuilder("pool").selector(app="x").port(8000).extension_ref("epp").build())
    kube.models.patch(ns, "m", {"spec": {"criticality": "Sheddable"}})
    kube.pods.list(ns, label_selector="app=x")

``create`` puts the namespace argument into the body's metadata, so builders need not be told it.
Failed requests raise ``kubernetes.client.exceptions.ApiException`` (``.status``, ``.body``);
``api_error_message`` extracts the server's message from one.

Every write returns the object as the write left it, with the resourceVersion of that write, and is
reported to ``on_write(plural, object)`` when one is given (the settle barrier records them). Two
writes need help to say which revision they made, because the server's answer does not:

* a custom resource deleted at once is answered with a ``Status`` (pods answer with the deleted pod,
  stamped with the deletion's revision: kube-apiserver's generic store returns the deleted object
  only for resources that ask for it);
* a write that removes the last finalizer of an object being deleted deletes it in a second step;
  the answer still carries the object's previous revision.

For those, the revision is read from the watch: the DELETED event of that object after the revision
it had. ``tests/integration/crds/test_write_revisions.py`` pins these facts on the real server.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from harness.cluster.crds import MODEL_PLURAL, OBJECTIVE_PLURAL, POOL_PLURAL, REWRITE_PLURAL
from harness.cluster.releases import MODEL_KINDS_GROUP, MODEL_KINDS_VERSION, Generation, session_generation

JsonObject = dict[str, Any]

MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
# How long to wait for the DELETED event of an object that a write has just deleted.
DELETION_WATCH_TIMEOUT: Final = 10

# Told of every write: (the resource's plural, the object as written, with the write's revision).
WriteObserver = Callable[[str, JsonObject], None]


def response_json(response: Any) -> JsonObject:
    """Decode the body of a raw (``_preload_content=False``) response into a JSON object."""
    data = json.loads(response.data)
    if not isinstance(data, dict):
        raise TypeError(f"expected a JSON object from the API server, got {type(data).__name__}")
    return data


def api_error_message(exc: ApiException) -> str:
    """The ``message`` of the Status the server returned with an error (the raw body otherwise)."""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if not body:
        return str(exc.reason or "")
    try:
        status = json.loads(body)
    except json.JSONDecodeError:
        return str(body)
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return str(status["message"])
    return str(body)


def _with_namespace(body: JsonObject, namespace: str) -> JsonObject:
    out = copy.deepcopy(body)
    out.setdefault("metadata", {})["namespace"] = namespace
    return out


def deleted_by_this_write(obj: JsonObject) -> bool:
    """The write emptied the finalizers of an object being deleted with no grace left: it is gone.

    The apiserver's rule (generic registry ``ShouldDeleteDuringUpdate``): no finalizers, a
    deletionTimestamp, and a deletionGracePeriodSeconds that is unset or 0.
    """
    meta = obj.get("metadata") or {}
    grace = meta.get("deletionGracePeriodSeconds")
    return bool(meta.get("deletionTimestamp")) and not meta.get("finalizers") and not grace


class WatchExpired(RuntimeError):
    """A watch asked to start at a revision the API server no longer keeps (410 Expired)."""


def _deletion_revision(
    watch: Callable[..., Any], name: str, since: str, timeout: int = DELETION_WATCH_TIMEOUT
) -> str:
    """The resourceVersion of the DELETED event of ``name`` after revision ``since``.

    Raises `WatchExpired` when ``since`` is older than the server's watch history (its watch cache
    keeps the last events of the kind cluster-wide, which a busy cluster turns over in seconds)."""
    try:
        response = watch(
            watch=True,
            field_selector=f"metadata.name={name}",
            resource_version=since,
            timeout_seconds=timeout,
            _preload_content=False,
            _request_timeout=timeout + 5,
        )
    except ApiException as exc:
        if exc.status == 410:
            raise WatchExpired(f"watching for the deletion of {name} from revision {since}: {exc}") from exc
        raise
    try:
        for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") == "DELETED":
                return str(event["object"]["metadata"]["resourceVersion"])
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                if status.get("code") == 410:
                    raise WatchExpired(f"watching for the deletion of {name} from revision {since}: {status}")
                raise RuntimeError(f"watching for the deletion of {name}: {status}")
    finally:
        response.close()  # mid-stream: the connection cannot be reused, only closed
        response.release_conn()
    raise TimeoutError(f"no DELETED event for {name} after revision {since} in {timeout}s")


def _at_revision(obj: JsonObject, revision: str) -> JsonObject:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = revision
    return out


class _Writes:
    """The shared tail of every write: resolve the revision of a write that deleted, then report it."""

    plural: str

    def __init__(self, on_write: WriteObserver | None) -> None:
        self._on_write = on_write

    def _watch(self, namespace: str) -> Callable[..., Any]:
        raise NotImplementedError

    def _written(self, namespace: str, obj: JsonObject) -> JsonObject:
        """The answer to a create/update/patch, with the revision of the deletion it may have caused."""
        if deleted_by_this_write(obj):
            name = str(obj["metadata"]["name"])
            since = str(obj["metadata"]["resourceVersion"])
            obj = _at_revision(obj, _deletion_revision(self._watch(namespace), name, since))
        return self._report(obj)

    def _report(self, obj: JsonObject) -> JsonObject:
        if self._on_write is not None:
            self._on_write(self.plural, obj)
        return obj


class CustomResourceClient(_Writes):
    """create/get/patch/replace/delete/list of one namespaced kind at one group/version."""

    def __init__(
        self,
        api_client: client.ApiClient,
        plural: str,
        on_write: WriteObserver | None = None,
        *,
        group: str = MODEL_KINDS_GROUP,
        version: str = MODEL_KINDS_VERSION,
    ) -> None:
        super().__init__(on_write)
        self._api = client.CustomObjectsApi(api_client)
        self.plural = plural
        self.group = group
        self.version = version

    def _watch(self, namespace: str) -> Callable[..., Any]:
        def watch(**kwargs: Any) -> Any:
            return self._api.list_namespaced_custom_object(
                group=self.group, version=self.version, namespace=namespace, plural=self.plural, **kwargs
            )

        return watch

    def create(self, namespace: str, body: JsonObject) -> JsonObject:
        created = self._api.create_namespaced_custom_object(
            group=self.group,
            version=self.version,
            namespace=namespace,
            plural=self.plural,
            body=_with_namespace(body, namespace),
            _preload_content=False,
        )
        return self._written(namespace, response_json(created))

    def get(self, namespace: str, name: str) -> JsonObject:
        return response_json(
            self._api.get_namespaced_custom_object(
                group=self.group,
                version=self.version,
                namespace=namespace,
                plural=self.plural,
                name=name,
                _preload_content=False,
            )
        )

    def patch(
        self, namespace: str, name: str, patch: JsonObject | list[JsonObject], content_type: str = MERGE_PATCH
    ) -> JsonObject:
        """Patch the object (JSON merge patch by default; pass ``JSON_PATCH`` with a list of ops)."""
        patched = self._api.patch_namespaced_custom_object(
            group=self.group,
            version=self.version,
            namespace=namespace,
            plural=self.plural,
            name=name,
            body=patch,
            _content_type=content_type,
            _preload_content=False,
        )
        return self._written(namespace, response_json(patched))

    def replace(self, namespace: str, body: JsonObject) -> JsonObject:
        """Update the whole object; ``body`` must carry ``metadata.name`` (and resourceVersion for CAS)."""
        replaced = self._api.replace_namespaced_custom_object(
            group=self.group,
            version=self.version,
            namespace=namespace,
            plural=self.plural,
            name=str(body["metadata"]["name"]),
            body=_with_namespace(body, namespace),
            _preload_content=False,
        )
        return self._written(namespace, response_json(replaced))

    def delete(self, namespace: str, name: str) -> JsonObject:
        """Delete; returns the object as deleted (see the module docstring for its revision).

        Held by a finalizer, that is the terminating object. Gone at once, the server answers with a
        Status only, so the object read just before is returned, stamped with the deletion's revision.
        """
        before = self.get(namespace, name)
        answer = response_json(
            self._api.delete_namespaced_custom_object(
                group=self.group,
                version=self.version,
                namespace=namespace,
                plural=self.plural,
                name=name,
                _preload_content=False,
            )
        )
        if answer.get("kind") == "Status":
            since = str(before["metadata"]["resourceVersion"])
            answer = _at_revision(before, _deletion_revision(self._watch(namespace), name, since))
        return self._report(answer)

    def list(self, namespace: str, label_selector: str | None = None) -> list[JsonObject]:
        return list_items(self.list_raw(namespace, label_selector))

    def list_raw(self, namespace: str, label_selector: str | None = None) -> JsonObject:
        """The whole List object, with ``metadata.resourceVersion`` to start a watch from."""
        return response_json(
            self._api.list_namespaced_custom_object(
                group=self.group,
                version=self.version,
                namespace=namespace,
                plural=self.plural,
                label_selector=label_selector,
                _preload_content=False,
            )
        )


class PodClient(_Writes):
    """create/get/patch/delete/list of Pods, plus writes to the status subresource."""

    plural = "pods"

    def __init__(self, api_client: client.ApiClient, on_write: WriteObserver | None = None) -> None:
        super().__init__(on_write)
        self._api = client.CoreV1Api(api_client)

    def _watch(self, namespace: str) -> Callable[..., Any]:
        def watch(**kwargs: Any) -> Any:
            return self._api.list_namespaced_pod(namespace=namespace, **kwargs)

        return watch

    def create(self, namespace: str, body: JsonObject) -> JsonObject:
        """Create a pod; the server ignores any ``status`` and ``deletionTimestamp`` in the body."""
        created = self._api.create_namespaced_pod(
            namespace=namespace,
            body=client.V1Pod.model_validate(_with_namespace(body, namespace)),
            _preload_content=False,
        )
        return self._written(namespace, response_json(created))

    def get(self, namespace: str, name: str) -> JsonObject:
        return response_json(
            self._api.read_namespaced_pod(name=name, namespace=namespace, _preload_content=False)
        )

    def patch(
        self, namespace: str, name: str, patch: JsonObject | list[JsonObject], content_type: str = MERGE_PATCH
    ) -> JsonObject:
        """Patch metadata/spec (JSON merge patch by default)."""
        patched = self._api.patch_namespaced_pod(
            name=name, namespace=namespace, body=patch, _content_type=content_type, _preload_content=False
        )
        return self._written(namespace, response_json(patched))

    def patch_status(
        self, namespace: str, name: str, patch: JsonObject | list[JsonObject], content_type: str = MERGE_PATCH
    ) -> JsonObject:
        """Patch through the ``status`` subresource (JSON merge patch: lists are replaced whole)."""
        patched = self._api.patch_namespaced_pod_status(
            name=name, namespace=namespace, body=patch, _content_type=content_type, _preload_content=False
        )
        return self._written(namespace, response_json(patched))

    def delete(self, namespace: str, name: str, grace_period_seconds: int | None = None) -> JsonObject:
        """Delete a pod; returns the server's answer: the pod, stamped with the deletion's revision when
        it went at once, or with its deletionTimestamp (and that write's revision) if it lingers."""
        deleted = self._api.delete_namespaced_pod(
            name=name,
            namespace=namespace,
            grace_period_seconds=grace_period_seconds,
            _preload_content=False,
        )
        # The answer carries the delete's own revision, whether the pod went or lingers ...
        answer = response_json(deleted)
        if not (answer.get("metadata") or {}).get("resourceVersion"):
            # ... except when the pod went meanwhile (its node agent finished a graceful deletion while
            # this one was on its way): kube-apiserver then answers with the pod's last state and no
            # revision. A consistent list's revision is past that deletion, so a settle waits for it.
            listed = response_json(
                self._api.list_namespaced_pod(namespace=namespace, limit=1, _preload_content=False)
            )
            answer = _at_revision(answer, str(listed["metadata"]["resourceVersion"]))
        return self._report(answer)

    def wait_deleted(
        self, namespace: str, pod: JsonObject, timeout: int = DELETION_WATCH_TIMEOUT
    ) -> JsonObject | None:
        """Wait until ``pod`` (as some write left it) is gone; the pod stamped with its deletion's
        revision, or None if it went so long ago that the server no longer has that event.

        The watch for the DELETED event starts at ``pod``'s revision. A graceful deletion may be awaited
        long after it began (the churn machine ends a termination steps later), by when a busy cluster
        has turned the server's watch history over and the watch is refused (410). Then a list says
        whether the pod is still there: if so, the watch starts again from the list's (current)
        revision, so the event is still to come; if not, it has gone, at a revision nobody can tell.

        For a graceful delete the node's kubelet makes that last delete; it is not reported to
        ``on_write`` here (the caller decides whether the deletion was its write).
        """
        name = str(pod["metadata"]["name"])
        uid = pod["metadata"].get("uid")
        since = str(pod["metadata"]["resourceVersion"])
        while True:
            try:
                return _at_revision(pod, _deletion_revision(self._watch(namespace), name, since, timeout))
            except WatchExpired:
                listed = response_json(
                    self._api.list_namespaced_pod(
                        namespace=namespace, field_selector=f"metadata.name={name}", _preload_content=False
                    )
                )
                if not any(item["metadata"].get("uid") == uid for item in list_items(listed)):
                    return None
                since = str(listed["metadata"]["resourceVersion"])

    def list(self, namespace: str, label_selector: str | None = None) -> list[JsonObject]:
        return list_items(self.list_raw(namespace, label_selector))

    def list_raw(self, namespace: str, label_selector: str | None = None) -> JsonObject:
        """The whole PodList, with ``metadata.resourceVersion`` to start a watch from."""
        return response_json(
            self._api.list_namespaced_pod(
                namespace=namespace, label_selector=label_selector, _preload_content=False
            )
        )


def list_items(list_object: JsonObject) -> list[JsonObject]:
    items = list_object.get("items") or []
    return [item for item in items if isinstance(item, dict)]


class Kube:
    """The kinds the project deals with, over one ``ApiClient``; every write told to ``on_write``.

    ``pools`` are those of ``generation`` (default: the session's, ``releases.session_generation``);
    ``models`` (InferenceModel) exist in a v1alpha2 cluster, ``objectives`` and ``rewrites`` in a v1
    one: all three kinds live in the x-k8s group at v1alpha2 in either.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        on_write: WriteObserver | None = None,
        generation: Generation | None = None,
    ) -> None:
        self.api_client = api_client
        self.generation = generation = generation or session_generation()
        self.pools = CustomResourceClient(
            api_client, POOL_PLURAL, on_write, group=generation.pool_group, version=generation.pool_version
        )
        self.models = CustomResourceClient(api_client, MODEL_PLURAL, on_write)
        self.objectives = CustomResourceClient(api_client, OBJECTIVE_PLURAL, on_write)
        self.rewrites = CustomResourceClient(api_client, REWRITE_PLURAL, on_write)
        self.pods = PodClient(api_client, on_write)
        # The kind whose objects claim model names: InferenceModel, or in v1 InferenceModelRewrite.
        self.claims = self.rewrites if generation.pool_group != MODEL_KINDS_GROUP else self.models

    def model_client(self, kind: str) -> CustomResourceClient:
        """The client of one of the kinds a served model is written as (``ModelBuilder.objects``)."""
        clients = {
            "InferenceModel": self.models,
            "InferenceObjective": self.objectives,
            "InferenceModelRewrite": self.rewrites,
        }
        return clients[kind]
