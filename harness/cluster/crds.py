"""Install upstream's own InferencePool / InferenceModel CRDs, verbatim, and wait until they are served.

The manifests are the ones the API module publishes (``sigs.k8s.io/gateway-api-inference-extension``,
``config/crd/bases/*.yaml``) at a pinned release, fetched once with ``go mod download`` (the
ordinary Go client and module proxy) and kept in the harness cache byte for byte. Never copies of our
own: a gate stricter (or looser) than a real cluster hides the bugs users hit.

``install_crds`` creates each CRD or replaces it in place with the manifest as parsed (raw JSON, no
generated model in between), then waits until every one has ``Established=True`` *and* its plural is
listed by discovery for each served version; discovery is asked afresh on every poll (no
client-side cache), as controller-runtime's envtest does.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, Final

import yaml
from filelock import FileLock
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.base.binaries import cache_root
from harness.cluster import gobuild, releases
from harness.cluster.releases import CRD_RELEASE_ENV, DEFAULT_CRD_RELEASE, default_release

__all__ = ["CRD_RELEASE_ENV", "DEFAULT_CRD_RELEASE", "default_release"]  # also read from here

CRD_MODULE: Final = "sigs.k8s.io/gateway-api-inference-extension"
_MANIFEST_DIR: Final = "config/crd/bases"

# The kinds of the v1alpha2 generation (v1's pool group is ``releases.V1``).
CRD_GROUP: Final = releases.V1ALPHA2.pool_group
CRD_VERSION: Final = releases.V1ALPHA2.pool_version
CRD_API_VERSION: Final = f"{CRD_GROUP}/{CRD_VERSION}"
POOL_KIND: Final = "InferencePool"
POOL_PLURAL: Final = "inferencepools"
MODEL_KIND: Final = "InferenceModel"
MODEL_PLURAL: Final = "inferencemodels"
OBJECTIVE_KIND: Final = "InferenceObjective"
OBJECTIVE_PLURAL: Final = "inferenceobjectives"
REWRITE_KIND: Final = "InferenceModelRewrite"
REWRITE_PLURAL: Final = "inferencemodelrewrites"

FIELD_MANAGER: Final = "epp-harness"
_CRD_API: Final = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
_POLL_INTERVAL_S: Final = 0.05
_CONFLICT_RETRIES: Final = 5


class CrdInstallError(RuntimeError):
    """The CRDs could not be fetched or installed, or were not served before the deadline."""


def manifest_paths(release: str | None = None) -> list[Path]:
    """The upstream CRD files of ``release``, from the harness cache (fetched into it on first use).

    A release that no longer ships the optional kinds gets them from the last one that did
    (`harness.cluster.releases.supplement_release`); its own files win for every other kind.
    """
    release = releases.check_release(release or default_release())
    paths = _release_files(release)
    other = releases.supplement_release(release)
    if other is not None:
        names = {path.name for path in paths}
        paths += [
            path
            for path in _release_files(other)
            if path.name in releases.OPTIONAL_KIND_FILES and path.name not in names
        ]
    return paths


def _release_files(release: str) -> list[Path]:
    directory = cache_root() / "crds" / CRD_MODULE.rsplit("/", 1)[-1] / release
    if not directory.is_dir():
        directory.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(directory.parent / f".{release}.lock")):
            if not directory.is_dir():
                _fetch(release, directory)
    paths = sorted(directory.glob("*.yaml"))
    if not paths:
        raise CrdInstallError(f"no CRD manifests in {directory}")
    return paths


def _fetch(release: str, directory: Path) -> None:
    """Copy ``config/crd/bases/*.yaml`` of the module at ``release`` into ``directory`` (atomically)."""
    try:
        info = gobuild.download_module(f"{CRD_MODULE}@{release}")
    except gobuild.GoBuildError as exc:
        raise CrdInstallError(f"fetching the CRDs of {CRD_MODULE}@{release}: {exc}") from exc
    source = Path(info["Dir"]) / _MANIFEST_DIR
    files = sorted(source.glob("*.yaml"))
    if not files:
        raise CrdInstallError(f"{CRD_MODULE}@{release} has no {_MANIFEST_DIR}/*.yaml")
    partial = Path(tempfile.mkdtemp(prefix=f".{release}-", dir=directory.parent))
    try:
        for file in files:
            shutil.copyfile(file, partial / file.name)  # the module cache is read-only: copy bytes only
        os.rename(partial, directory)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def load_crd_manifests(release: str | None = None) -> list[dict[str, Any]]:
    """The upstream CRD manifests of ``release``, parsed."""
    manifests: list[dict[str, Any]] = []
    for path in manifest_paths(release):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is None:
                continue
            if not isinstance(document, dict) or document.get("kind") != "CustomResourceDefinition":
                raise CrdInstallError(f"{path} holds something other than a CustomResourceDefinition")
            manifests.append(document)
    return manifests


def install_crds(
    api_client: client.ApiClient,
    timeout: float = 30.0,
    release: str | None = None,
    without: Collection[str] = (),
) -> None:
    """Create or update the upstream CRDs, then wait until each is Established and listed by discovery.

    ``without``: CRD names left out, for a cluster that never had those kinds (deleting a CRD
    instead waits on the API server's finalizer, which can take longer than a test should wait).
    Raises ``CrdInstallError`` when the server rejects a manifest, a name in ``without`` is not one
    of the release's CRDs, or the CRDs are not served within ``timeout`` seconds (the message names
    what is still missing).
    """
    deadline = time.monotonic() + timeout
    manifests = load_crd_manifests(release)
    unknown = set(without) - {str(m["metadata"]["name"]) for m in manifests}
    if unknown:
        raise CrdInstallError(f"not CRDs of {release or default_release()}: {sorted(unknown)}")
    manifests = [m for m in manifests if m["metadata"]["name"] not in without]
    api = client.CustomObjectsApi(api_client)
    for manifest in manifests:
        _create_or_update(api, manifest)
    names = [str(m["metadata"]["name"]) for m in manifests]
    served = {
        (str(m["spec"]["group"]), str(v["name"]), str(m["spec"]["names"]["plural"]))
        for m in manifests
        for v in m["spec"]["versions"]
        if v.get("served")
    }
    _wait_until_served(api, names, served, deadline, timeout)


def read_crd(api_client: client.ApiClient, name: str) -> dict[str, Any]:
    """The CRD ``name`` as the server holds it (API JSON)."""
    return _read_crd(client.CustomObjectsApi(api_client), name)


def _create_or_update(api: client.CustomObjectsApi, manifest: dict[str, Any]) -> None:
    name = str(manifest["metadata"]["name"])
    group, version, plural = _CRD_API
    for _ in range(_CONFLICT_RETRIES):
        try:
            current = _read_crd(api, name)
        except ApiException as exc:
            if exc.status != 404:
                raise CrdInstallError(f"reading CRD {name}: {_reason(exc)}") from exc
            try:
                _json_body(
                    api.create_cluster_custom_object(
                        group,
                        version,
                        plural,
                        body=manifest,
                        field_manager=FIELD_MANAGER,
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
                api.replace_cluster_custom_object(
                    group,
                    version,
                    plural,
                    name,
                    body=desired,
                    field_manager=FIELD_MANAGER,
                    _preload_content=False,
                )
            )
            return
        except ApiException as exc:
            if exc.status == 409:  # someone else updated it between our read and write
                continue
            raise CrdInstallError(f"updating CRD {name}: {_reason(exc)}") from exc
    raise CrdInstallError(f"updating CRD {name}: still conflicting after {_CONFLICT_RETRIES} attempts")


def _read_crd(api: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    group, version, plural = _CRD_API
    return _json_body(api.get_cluster_custom_object(group, version, plural, name, _preload_content=False))


def _wait_until_served(
    api: client.CustomObjectsApi,
    names: list[str],
    served: set[tuple[str, str, str]],
    deadline: float,
    timeout: float,
) -> None:
    pending: dict[str, str] = dict.fromkeys(names, "not read yet")  # CRD name -> its conditions
    missing = set(served)
    while True:
        for name in list(pending):
            established, summary = _established(api, name)
            if established:
                del pending[name]
            else:
                pending[name] = summary
        if not pending:
            missing -= _served(api, {(g, v) for g, v, _ in missing})
            if not missing:
                return
        if time.monotonic() >= deadline:
            raise CrdInstallError(
                f"CRDs not served after {timeout:g}s: not Established: "
                f"{ {n: pending[n] for n in sorted(pending)} }; "
                f"not in discovery: {sorted(f'{g}/{v} {p}' for g, v, p in missing)}"
            )
        time.sleep(_POLL_INTERVAL_S)


def _established(api: client.CustomObjectsApi, name: str) -> tuple[bool, str]:
    """Whether the CRD has Established=True, and its conditions as text (for the timeout error)."""
    conditions = _read_crd(api, name).get("status", {}).get("conditions") or []
    established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
    summary = ", ".join(
        f"{c.get('type')}={c.get('status')}" + (f" ({c.get('message')})" if c.get("message") else "")
        for c in conditions
    )
    return established, summary or "no conditions"


def _served(
    api: client.CustomObjectsApi, group_versions: Iterable[tuple[str, str]]
) -> set[tuple[str, str, str]]:
    """(group, version, plural) listed by a fresh discovery request for each group/version."""
    found: set[tuple[str, str, str]] = set()
    for group, version in group_versions:
        try:
            response = api.get_api_resources(group=group, version=version, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        for resource in _json_body(response).get("resources") or []:
            name = str(resource.get("name", ""))
            if "/" not in name:
                found.add((group, version, name))
    return found


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
