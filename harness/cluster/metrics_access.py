"""Reading an EPP's ``/metrics`` the way Prometheus does in a cluster: with a ServiceAccount token.

Upstream's EPP (controller-runtime's metrics server with ``WithAuthenticationAndAuthorization``)
answers ``/metrics`` only for a bearer token that TokenReview accepts and SubjectAccessReview allows
``get`` on the non-resource URL ``/metrics``; ours serves anyone, and ignores the header. So the
harness reads every EPP's metrics with such a token: a ServiceAccount in the pool's namespace, bound
to a ClusterRole granting exactly that, and a token from the TokenRequest API. The ClusterRole and
its binding are cluster-wide: ``close()`` deletes them.
"""

from __future__ import annotations

import contextlib
from typing import Final

import httpx2
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.cluster.kube import response_json

ACCOUNT: Final = "epp-metrics-reader"
TOKEN_SECONDS: Final = 3600


class MetricsReader:
    """A token allowed ``GET /metrics`` (made on first use), and the page read with it."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self._api = api_client
        self.namespace = namespace
        self.role_name = f"{namespace}-{ACCOUNT}"
        self._token: str | None = None
        self._made_rbac = False

    def token(self) -> str:
        if self._token is None:
            self._token = self._make_token()
        return self._token

    def metrics_text(self, base_url: str, timeout: float = 10.0) -> str:
        """``GET {base_url}/metrics`` with the token; raises ``RuntimeError`` on any other answer than 200."""
        response = httpx2.get(
            f"{base_url}/metrics", headers={"authorization": f"Bearer {self.token()}"}, timeout=timeout
        )
        if response.status_code != 200:
            raise RuntimeError(f"GET {base_url}/metrics -> {response.status_code} {response.text[:200]!r}")
        return response.text

    def _make_token(self) -> str:
        core, rbac = client.CoreV1Api(self._api), client.RbacAuthorizationV1Api(self._api)
        with contextlib.suppress(ApiException):  # exists already (another reader in this namespace)
            core.create_namespaced_service_account(
                self.namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=ACCOUNT))
            )
        meta = client.V1ObjectMeta(name=self.role_name)
        self._made_rbac = True
        rule = client.V1PolicyRule(verbs=["get"], non_resource_urls=["/metrics"])
        with contextlib.suppress(ApiException):
            rbac.create_cluster_role(client.V1ClusterRole(metadata=meta, rules=[rule]))
        with contextlib.suppress(ApiException):
            rbac.create_cluster_role_binding(
                client.V1ClusterRoleBinding(
                    metadata=meta,
                    role_ref=client.V1RoleRef(
                        api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=self.role_name
                    ),
                    subjects=[
                        client.RbacV1Subject(kind="ServiceAccount", name=ACCOUNT, namespace=self.namespace)
                    ],
                )
            )
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS)
        )
        reply = core.create_namespaced_service_account_token(
            ACCOUNT, self.namespace, request, _preload_content=False
        )
        return str(response_json(reply)["status"]["token"])

    def close(self) -> None:
        """Delete the cluster-wide ClusterRole and binding (the ServiceAccount goes with its namespace)."""
        if not self._made_rbac:
            return
        rbac = client.RbacAuthorizationV1Api(self._api)
        for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            with contextlib.suppress(ApiException):
                delete(self.role_name)
        self._made_rbac = False
