"""Install the project's CRDs (InferencePool, InferenceModel) and wait until they are served.

The manifests live beside this module in ``harness/crds/*.yaml``. ``install_crds`` creates each CRD
or updates it in place, then waits until every one has ``Established=True`` *and* its plural is listed
by discovery at ``/apis/inference.networking.x-k8s.io/v1alpha2``; discovery is asked afresh on every
poll (no client-side discovery cache), as controller-runtime's envtest does.
"""

from __future__ import annotations

import importlib.resources
import json
import time
from typing import Any, Final

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

CRD_GROUP: Final = "inference.networking.x-k8s.io"
CRD_VERSION: Final = "v1alpha2"
CRD_API_VERSION: Final = f"{CRD_GROUP}/{CRD_VERSION}"

POOL_KIND: Final = "InferencePool"
POOL_PLURAL: Final = "inferencepools"
MODEL_KIND: Final = "InferenceModel"
MODEL_PLURAL: Final = "inferencemodels"

CRD_FILES: Final = ("inferencepools.yaml", "inferencemodels.yaml")

_POLL_INTERVAL_S: Final = 0.05
_CONFLICT_RETRIES: Final = 5


class CrdInstallError(RuntimeError):
    """The CRDs could not be installed, or were not served before the deadline."""


def load_crd_manifests() -> list[dict[str, Any]]:
    """The CRD manifests shipped in the package, as API JSON dicts."""
    folder = importlib.resources.files("harness").joinpath("crds")
    manifests: list[dict[str, Any]] = []
    for filename in CRD_FILES:
        document = yaml.safe_load(folder.joinpath(filename).read_text(encoding="utf-8"))
        if not isinstance(document, dict) or document.get("kind") != "CustomResourceDefinition":
            raise CrdInstallError(f"{filename} is not a CustomResourceDefinition manifest")
        manifests.append(document)
    return manifests


def install_crds(api_client: client.ApiClient, timeout: float = 30.0) -> None:
    """Create or update our CRDs, then wait until each is Established and listed by discovery.

    Raises ``CrdInstallError`` when the server rejects a manifest or the CRDs are not served
    within ``timeout`` seconds (the message names what is still missing).
    """
    deadline = time.monotonic() + timeout
    manifests = load_crd_manifests()
    extensions = client.ApiextensionsV1Api(api_client)
    for manifest in manifests:
        _create_or_update(extensions, manifest)
    names = [str(m["metadata"]["name"]) for m in manifests]
    plurals = {str(m["spec"]["names"]["plural"]) for m in manifests}
    _wait_until_served(api_client, extensions, names, plurals, deadline, timeout)


def _create_or_update(extensions: client.ApiextensionsV1Api, manifest: dict[str, Any]) -> None:
    name = str(manifest["metadata"]["name"])
    for _ in range(_CONFLICT_RETRIES):
        try:
            current = _read_crd(extensions, name)
        except ApiException as exc:
            if exc.status != 404:
                raise CrdInstallError(f"reading CRD {name}: {_reason(exc)}") from exc
            try:
                _json_body(
                    extensions.create_custom_resource_definition(
                        body=client.V1CustomResourceDefinition.model_validate(manifest),
                        _preload_content=False,
                    )
                )  # read the reply: an unread one is logged by the server as an aborted request
                return
            except ApiException as create_exc:
                if create_exc.status == 409:  # created concurrently: update it instead
                    continue
                raise CrdInstallError(f"creating CRD {name}: {_reason(create_exc)}") from create_exc
        desired = {
            **manifest,
            "metadata": {**manifest["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        try:
            _json_body(
                extensions.replace_custom_resource_definition(
                    name=name,
                    body=client.V1CustomResourceDefinition.model_validate(desired),
                    _preload_content=False,
                )
            )
            return
        except ApiException as exc:
            if exc.status == 409:  # someone else updated it between our read and write
                continue
            raise CrdInstallError(f"updating CRD {name}: {_reason(exc)}") from exc
    raise CrdInstallError(f"updating CRD {name}: still conflicting after {_CONFLICT_RETRIES} attempts")


def _read_crd(extensions: client.ApiextensionsV1Api, name: str) -> dict[str, Any]:
    response = extensions.read_custom_resource_definition(name=name, _preload_content=False)
    return _json_body(response)


def _wait_until_served(
    api_client: client.ApiClient,
    extensions: client.ApiextensionsV1Api,
    names: list[str],
    plurals: set[str],
    deadline: float,
    timeout: float,
) -> None:
    custom = client.CustomObjectsApi(api_client)
    pending: dict[str, str] = dict.fromkeys(names, "not read yet")  # CRD name -> its conditions
    missing_plurals: set[str] = set(plurals)
    while True:
        for name in list(pending):
            established, summary = _established(extensions, name)
            if established:
                del pending[name]
            else:
                pending[name] = summary
        if not pending:
            missing_plurals -= _served_plurals(custom)
            if not missing_plurals:
                return
        if time.monotonic() >= deadline:
            raise CrdInstallError(
                f"CRDs not served after {timeout:g}s: not Established: "
                f"{ {n: pending[n] for n in sorted(pending)} }; "
                f"not in discovery at /apis/{CRD_API_VERSION}: {sorted(missing_plurals)}"
            )
        time.sleep(_POLL_INTERVAL_S)


def _established(extensions: client.ApiextensionsV1Api, name: str) -> tuple[bool, str]:
    """Whether the CRD has Established=True, and its conditions as text (for the timeout error)."""
    conditions = _read_crd(extensions, name).get("status", {}).get("conditions") or []
    established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
    summary = ", ".join(
        f"{c.get('type')}={c.get('status')}" + (f" ({c.get('message')})" if c.get("message") else "")
        for c in conditions
    )
    return established, summary or "no conditions"


def _served_plurals(custom: client.CustomObjectsApi) -> set[str]:
    """Plurals listed by a fresh discovery request for our group/version (empty if not served yet)."""
    try:
        response = custom.get_api_resources(group=CRD_GROUP, version=CRD_VERSION, _preload_content=False)
    except ApiException as exc:
        if exc.status == 404:
            return set()
        raise
    body = _json_body(response)
    return {str(r["name"]) for r in body.get("resources") or [] if "/" not in str(r.get("name", ""))}


def _json_body(response: Any) -> dict[str, Any]:
    data = json.loads(response.data)
    if not isinstance(data, dict):
        raise CrdInstallError(f"expected a JSON object from the API server, got {type(data).__name__}")
    return data


def _reason(exc: ApiException) -> str:
    """``HTTP <code>: <the Status message>`` (the raw body when it is not a Status)."""
    text = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else exc.body
    try:
        status = json.loads(text) if text else None
    except json.JSONDecodeError:
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    return f"HTTP {exc.status}: {message or text or exc.reason}"
