"""Thin typed helpers over the ``kubernetes`` client, shared by tests and the CLI.

Everything goes in and comes out as API JSON (``dict[str, Any]`` with the API's camelCase keys),
the same shape ``harness.builders`` produces and the EPP parses; no generated model classes leak out.

    kube = Kube(api_client)
    kube.pools.create(ns, PoolBuilder("pool").selector(app="x").port(8000).extension_ref("epp").build())
    kube.models.patch(ns, "m", {"spec": {"criticality": "Sheddable"}})
    kube.pods.list(ns, label_selector="app=x")

``create`` puts the namespace argument into the body's metadata, so builders need not be told it.
Failed requests raise ``kubernetes.client.exceptions.ApiException`` (``.status``, ``.body``);
``api_error_message`` extracts the server's message from one.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.crds import CRD_GROUP, CRD_VERSION, MODEL_PLURAL, POOL_PLURAL

JsonObject = dict[str, Any]

MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"


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


class CustomResourceClient:
    """create/get/patch/replace/delete/list of one namespaced kind of our CRD group/version."""

    def __init__(self, api_client: client.ApiClient, plural: str) -> None:
        self._api = client.CustomObjectsApi(api_client)
        self.plural = plural

    def create(self, namespace: str, body: JsonObject) -> JsonObject:
        return response_json(
            self._api.create_namespaced_custom_object(
                group=CRD_GROUP,
                version=CRD_VERSION,
                namespace=namespace,
                plural=self.plural,
                body=_with_namespace(body, namespace),
                _preload_content=False,
            )
        )

    def get(self, namespace: str, name: str) -> JsonObject:
        return response_json(
            self._api.get_namespaced_custom_object(
                group=CRD_GROUP,
                version=CRD_VERSION,
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
        return response_json(
            self._api.patch_namespaced_custom_object(
                group=CRD_GROUP,
                version=CRD_VERSION,
                namespace=namespace,
                plural=self.plural,
                name=name,
                body=patch,
                _content_type=content_type,
                _preload_content=False,
            )
        )

    def replace(self, namespace: str, body: JsonObject) -> JsonObject:
        """Update the whole object; ``body`` must carry ``metadata.name`` (and resourceVersion for CAS)."""
        return response_json(
            self._api.replace_namespaced_custom_object(
                group=CRD_GROUP,
                version=CRD_VERSION,
                namespace=namespace,
                plural=self.plural,
                name=str(body["metadata"]["name"]),
                body=_with_namespace(body, namespace),
                _preload_content=False,
            )
        )

    def delete(self, namespace: str, name: str) -> None:
        self._api.delete_namespaced_custom_object(
            group=CRD_GROUP,
            version=CRD_VERSION,
            namespace=namespace,
            plural=self.plural,
            name=name,
            _preload_content=False,
        )

    def list(self, namespace: str, label_selector: str | None = None) -> list[JsonObject]:
        return list_items(self.list_raw(namespace, label_selector))

    def list_raw(self, namespace: str, label_selector: str | None = None) -> JsonObject:
        """The whole List object, with ``metadata.resourceVersion`` to start a watch from."""
        return response_json(
            self._api.list_namespaced_custom_object(
                group=CRD_GROUP,
                version=CRD_VERSION,
                namespace=namespace,
                plural=self.plural,
                label_selector=label_selector,
                _preload_content=False,
            )
        )


class PodClient:
    """create/get/patch/delete/list of Pods, plus writes to the status subresource."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._api = client.CoreV1Api(api_client)

    def create(self, namespace: str, body: JsonObject) -> JsonObject:
        """Create a pod; the server ignores any ``status`` and ``deletionTimestamp`` in the body."""
        return response_json(
            self._api.create_namespaced_pod(
                namespace=namespace,
                body=client.V1Pod.model_validate(_with_namespace(body, namespace)),
                _preload_content=False,
            )
        )

    def get(self, namespace: str, name: str) -> JsonObject:
        return response_json(
            self._api.read_namespaced_pod(name=name, namespace=namespace, _preload_content=False)
        )

    def patch(
        self, namespace: str, name: str, patch: JsonObject | list[JsonObject], content_type: str = MERGE_PATCH
    ) -> JsonObject:
        """Patch metadata/spec (JSON merge patch by default)."""
        return response_json(
            self._api.patch_namespaced_pod(
                name=name, namespace=namespace, body=patch, _content_type=content_type, _preload_content=False
            )
        )

    def patch_status(
        self, namespace: str, name: str, patch: JsonObject | list[JsonObject], content_type: str = MERGE_PATCH
    ) -> JsonObject:
        """Patch through the ``status`` subresource (JSON merge patch: lists are replaced whole)."""
        return response_json(
            self._api.patch_namespaced_pod_status(
                name=name, namespace=namespace, body=patch, _content_type=content_type, _preload_content=False
            )
        )

    def delete(self, namespace: str, name: str, grace_period_seconds: int | None = None) -> JsonObject:
        """Delete a pod; returns the server's answer (the pod, with deletionTimestamp if it lingers)."""
        return response_json(
            self._api.delete_namespaced_pod(
                name=name,
                namespace=namespace,
                grace_period_seconds=grace_period_seconds,
                _preload_content=False,
            )
        )

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
    """The three kinds the project deals with, over one ``ApiClient``."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.pools = CustomResourceClient(api_client, POOL_PLURAL)
        self.models = CustomResourceClient(api_client, MODEL_PLURAL)
        self.pods = PodClient(api_client)
