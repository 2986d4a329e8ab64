"""A running EPP keeps watching after its ServiceAccount token is rotated and the old one dies.

What a kubelet does to a projected token, done by hand on the shared API server: the EPP runs as a
ServiceAccount whose token (a TokenRequest bound to a Secret, so deleting the Secret kills it) sits
in a file its kubeconfig names (`tokenFile`). Mid-run the file is atomically replaced by a new token
and the old one is revoked; the test waits until the API server really refuses the old token, then
cuts every connection the EPP has (a TCP proxy sits between it and the API server), so whatever it
learns next comes through a new request, authenticated with whatever it reads from the file then.
A pod added after that must reach the datastore. An EPP that read the token once (or cached it past
a change of the file) gets 401 on every relist and watch from then on and never sees the pod.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from harness.base.eventually import eventually
from harness.base.ports import LOOPBACK
from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.kube import response_json
from harness.cluster.releases import MODEL_KINDS_GROUP, V1, V1ALPHA2
from harness.dataplane.tcp_proxy import TcpProxy

from .support import serving

pytestmark = pytest.mark.integration

ACCOUNT = "epp"
TOKEN_SECONDS = 600  # the API server's minimum
# The API server caches a token's successful authentication for 10 s: revocation shows within that.
REVOKED_WITHIN_S = 30.0
CONVERGE_TIMEOUT_S = 30.0
READ_ONLY_ROLE = {
    "metadata": {"name": "epp-reader"},
    "rules": [
        {
            "apiGroups": ["", V1.pool_group, V1ALPHA2.pool_group, MODEL_KINDS_GROUP],
            "resources": ["pods", "inferencepools", *V1ALPHA2.model_plurals, *V1.model_plurals],
            "verbs": ["get", "list", "watch"],
        }
    ],
}


@dataclass
class Identity:
    """The EPP's ServiceAccount: its token file, and the tokens it has been given (newest last)."""

    kube_api: ApiClient
    namespace: str
    directory: Path
    access: ClusterAccess
    tokens: list[str]

    @property
    def token_file(self) -> Path:
        return self.directory / "token"

    def issue(self, secret: str) -> str:
        """A token bound to a new Secret `secret` (deleting the Secret revokes it), written to the
        token file by an atomic rename as a kubelet swaps a projected volume."""
        core = client.CoreV1Api(self.kube_api)
        created = response_json(
            core.create_namespaced_secret(
                self.namespace,
                client.V1Secret(metadata=client.V1ObjectMeta(name=secret)),
                _preload_content=False,
            )
        )
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [],
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {
                    "kind": "Secret",
                    "apiVersion": "v1",
                    "name": secret,
                    "uid": created["metadata"]["uid"],
                },
            },
        }
        reply = response_json(
            core.create_namespaced_service_account_token(
                ACCOUNT, self.namespace, request, _preload_content=False
            )
        )
        token = str(reply["status"]["token"])
        staged = self.directory / ".token.new"
        staged.write_text(token, encoding="utf-8")
        os.replace(staged, self.token_file)
        self.tokens.append(token)
        return token

    def revoke(self, secret: str) -> None:
        client.CoreV1Api(self.kube_api).delete_namespaced_secret(secret, self.namespace)

    def status_with(self, token: str) -> int:
        """What the API server answers a pod list made with `token` (directly, not through the proxy)."""
        config = client.Configuration()
        config.host = self.access.server_url
        config.ssl_ca_cert = str(self.access.ca_cert_path)
        config.api_key = {"authorization": f"Bearer {token}"}
        with client.ApiClient(config) as api:
            try:
                client.CoreV1Api(api).list_namespaced_pod(self.namespace, _preload_content=False)
            except ApiException as exc:
                return int(exc.status or 0)
        return 200


def kubeconfig_with_token_file(admin: Path, target: Path, server_url: str, token_file: Path) -> None:
    """The admin kubeconfig's cluster (its CA), reached at `server_url`, as a user whose bearer token
    is read from `token_file`."""
    config: dict[str, Any] = yaml.safe_load(admin.read_text(encoding="utf-8"))
    [context] = [c for c in config["contexts"] if c["name"] == config["current-context"]]
    [cluster] = [c for c in config["clusters"] if c["name"] == context["context"]["cluster"]]
    cluster["cluster"]["server"] = server_url
    config["clusters"] = [cluster]
    config["users"] = [{"name": ACCOUNT, "user": {"tokenFile": str(token_file)}}]
    context["context"]["user"] = ACCOUNT
    config["contexts"] = [context]
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    target.chmod(0o600)


@pytest.fixture
def proxy(control_plane: ClusterAccess) -> Iterator[TcpProxy]:
    port = int(control_plane.server_url.rsplit(":", 1)[1])
    with TcpProxy(LOOPBACK, port) as started:
        yield started


@pytest.fixture
def identity(control_plane: ClusterAccess, kube_api: ApiClient, namespace: str, tmp_path: Path) -> Identity:
    if control_plane.ca_cert_path is None:
        pytest.skip("needs the harness's own plane (its CA file)")
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=ACCOUNT))
    )
    rbac = client.RbacAuthorizationV1Api(kube_api)
    rbac.create_namespaced_role(namespace, client.V1Role.model_validate(READ_ONLY_ROLE))
    binding = {
        "metadata": {"name": "epp-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "epp-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
    }
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding.model_validate(binding))
    return Identity(kube_api, namespace, tmp_path, control_plane, [])


@pytest.fixture
def bed(
    control_plane: ClusterAccess,
    kube_api: ApiClient,
    namespace: str,
    identity: Identity,
    proxy: TcpProxy,
    tmp_path: Path,
) -> Iterator[TestBed]:
    identity.issue("token-1")
    # RBAC and the new account are seen at once by a single API server, but poll rather than hope.
    eventually(lambda: _assert_equal(identity.status_with(identity.tokens[0]), 200), timeout=30)
    kubeconfig = tmp_path / "epp.kubeconfig"
    kubeconfig_with_token_file(
        control_plane.kubeconfig_path, kubeconfig, f"https://{proxy.address}", identity.token_file
    )
    with TestBed(kube_api, namespace, kubeconfig) as testbed:
        yield testbed


def _assert_equal(actual: object, expected: object) -> None:
    assert actual == expected


def test_the_epp_keeps_watching_after_its_token_is_rotated_and_the_old_one_revoked(
    bed: TestBed, identity: Identity, proxy: TcpProxy
) -> None:
    serving(bed, "p1")

    old = identity.tokens[0]
    new = identity.issue("token-2")
    identity.revoke("token-1")
    eventually(
        lambda: _assert_equal(identity.status_with(old), 401),
        timeout=REVOKED_WITHIN_S,
        message="the API server still accepts the revoked token",
    )
    assert identity.status_with(new) == 200
    # Every watch the EPP holds was authenticated with the old token: close them all, so what it
    # learns from here on comes through requests made with the token file as it is now.
    assert proxy.cut() >= 1, "the EPP held no connection to the API server: nothing was rotated"
    proxy.restore()

    bed.add_pod("p2")
    verdict = bed.eventually_consistent(timeout=CONVERGE_TIMEOUT_S)
    assert set(bed.datastore_pods()) == {"p1", "p2"}, verdict.summary()
