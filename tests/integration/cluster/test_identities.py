"""RBAC as a real cluster enforces it, for identities the harness mints.

Each check would fail if authorization were off (AlwaysAllow lets everything through): an identity
with no binding is refused, and with a Role it gets exactly what the Role grants.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from harness.base.eventually import eventually
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.kubectl import KubectlError, kubectl
from harness.plugin.core import Identities

pytestmark = pytest.mark.integration

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {"containers": [{"name": "c", "image": "c:1"}]},
}


def _status(call: Callable[[], object]) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status or 0)
    return 200


def _grant_pod_reading(admin: ApiClient, namespace: str, subject: dict[str, str]) -> None:
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_namespaced_role(
        namespace,
        client.V1Role.model_validate(
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
            }
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding.model_validate(
            {
                "metadata": {"name": "pod-reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                "subjects": [subject],
            }
        ),
    )


def _check_rbac(
    kube_api: ApiClient, namespace: str, identity: ClusterAccess, subject: dict[str, str]
) -> None:
    kubeconfig = identity.kubeconfig_path
    with identity.api_client() as api:
        pods = client.CoreV1Api(api)

        # No binding: refused, through the Python client and through kubectl.
        assert _status(lambda: pods.list_namespaced_pod(namespace)) == 403
        with pytest.raises(KubectlError, match="Forbidden"):
            kubectl(kubeconfig, "get", "pods", namespace=namespace)

        _grant_pod_reading(kube_api, namespace, subject)

        # Exactly what the Role grants: list works (once RBAC has seen the binding), create does not.
        eventually(
            lambda: _assert_equal(_status(lambda: pods.list_namespaced_pod(namespace)), 200), timeout=30
        )
        assert (
            json.loads(kubectl(kubeconfig, "get", "pods", "-o", "json", namespace=namespace))["items"] == []
        )
        assert _status(lambda: pods.create_namespaced_pod(namespace, client.V1Pod.model_validate(POD))) == 403
        with pytest.raises(KubectlError, match="Forbidden"):
            kubectl(kubeconfig, "apply", "-f", "-", namespace=namespace, stdin=json.dumps(POD))
        assert kubectl(kubeconfig, "auth", "can-i", "watch", "pods", namespace=namespace).strip() == "yes"
        # Nothing beyond the namespace and the resource.
        assert _status(lambda: pods.list_namespaced_config_map(namespace)) == 403
        assert _status(lambda: pods.list_namespaced_pod("default")) == 403


def _assert_equal(actual: object, expected: object) -> None:
    assert actual == expected


def test_a_user_gets_exactly_what_a_role_grants(
    kube_api: ApiClient, namespace: str, identities: Identities
) -> None:
    alice = identities.user(f"alice-{namespace}", ["developers"])
    whoami = json.loads(kubectl(alice.kubeconfig_path, "auth", "whoami", "-o", "json"))
    assert whoami["status"]["userInfo"]["username"] == f"alice-{namespace}"
    assert "developers" in whoami["status"]["userInfo"]["groups"]

    _check_rbac(kube_api, namespace, alice, {"kind": "User", "name": f"alice-{namespace}"})


def test_a_group_binding_applies_to_its_members(
    kube_api: ApiClient, namespace: str, identities: Identities
) -> None:
    bob = identities.user("bob", [f"readers-{namespace}"])
    _check_rbac(kube_api, namespace, bob, {"kind": "Group", "name": f"readers-{namespace}"})


def test_a_service_account_token_gets_exactly_what_a_role_grants(
    kube_api: ApiClient, namespace: str, identities: Identities
) -> None:
    reader = identities.service_account(namespace, "reader")
    whoami = json.loads(kubectl(reader.kubeconfig_path, "auth", "whoami", "-o", "json"))
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:reader"

    _check_rbac(
        kube_api, namespace, reader, {"kind": "ServiceAccount", "name": "reader", "namespace": namespace}
    )
