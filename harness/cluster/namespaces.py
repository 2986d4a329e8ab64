"""Create a namespace that is ready for pods, in a plane with controllers or without.

In a cluster whose controller-manager runs (the full harness plane, any real cluster), the
ServiceAccount admission plugin rejects pods until the ServiceAccount controller has created the
namespace's ``default`` ServiceAccount, which happens asynchronously after the namespace is created.
In the minimal plane nothing ever creates it (and admission does not ask for it). So, after creating
the namespace, ``create_namespace`` waits for its ``default`` ServiceAccount exactly when the cluster
creates them: when the ``default`` namespace has one (the full harness plane is only reported ready
once it does).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from harness.base.eventually import eventually

if TYPE_CHECKING:  # imported where used: the pytest plugin imports this module in unit-only runs too
    from kubernetes.client import ApiClient, CoreV1Api

TEST_LABEL: Final = {"epp-harness/test": "true"}
_DEFAULT_SERVICE_ACCOUNT: Final = "default"


def create_namespace(
    api_client: ApiClient,
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    exist_ok: bool = False,
    timeout: float = 30.0,
) -> None:
    """Create namespace ``name`` (``exist_ok``: a 409 is fine) and wait until pods can be created in it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    body = client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=dict(labels or {})))
    try:
        _drain(core.create_namespace(body, _preload_content=False))
    except ApiException as exc:
        if not (exist_ok and exc.status == 409):
            raise
    if creates_service_accounts(api_client):
        wait_for_default_service_account(api_client, name, timeout)


def creates_service_accounts(api_client: ApiClient) -> bool:
    """Whether this cluster's controllers create ``default`` ServiceAccounts (``default`` has one)."""
    from kubernetes import client

    return _has_default_service_account(client.CoreV1Api(api_client), "default")


def wait_for_default_service_account(api_client: ApiClient, namespace: str, timeout: float = 30.0) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def present() -> None:
        assert _has_default_service_account(core, namespace), f"no default ServiceAccount in {namespace} yet"

    eventually(present, timeout=timeout, message=f"the default ServiceAccount of namespace {namespace}")


def namespace_name(test_name: str) -> str:
    """A DNS-1123 label from the test name plus random hex, always unique and at most 63 chars."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:48].rstrip("-") or "test"
    return f"{slug}-{secrets.token_hex(4)}"


def _has_default_service_account(core: CoreV1Api, namespace: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        _drain(
            core.read_namespaced_service_account(_DEFAULT_SERVICE_ACCOUNT, namespace, _preload_content=False)
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _drain(response: Any) -> None:
    """Read a raw (``_preload_content=False``) reply: an unread one is logged by the server as aborted."""
    response.read()
