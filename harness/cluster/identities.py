"""Kubeconfigs for identities other than the admin: a user in groups, or a ServiceAccount.

So tests can check what RBAC really allows (the admin is in ``system:masters``, which every
authorizer lets through, so nothing run as admin can show an RBAC mistake).

* ``user_access``: a client certificate with CN=user and O=each group, signed by the harness plane's
  CA (kept in its PKI directory for this). Only for planes the harness started.
* ``service_account_access``: a bearer token from the TokenRequest API (what a kubelet mounts into a
  pod), requested by the admin. Works against any cluster.

Both return a ``ClusterAccess`` whose self-contained kubeconfig kubectl and the EPP can use.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.cluster import certs
from harness.cluster.controlplane import ClusterAccess, write_kubeconfig
from harness.cluster.kube import response_json

DEFAULT_TOKEN_SECONDS: Final = 3600


class IdentityError(RuntimeError):
    """The identity cannot be minted for this cluster; the message says why."""


def user_access(
    access: ClusterAccess, user: str, groups: Sequence[str] = (), *, directory: Path
) -> ClusterAccess:
    """A kubeconfig (in ``directory``) authenticating as ``user`` in ``groups`` by client certificate."""
    if access.ca_cert_path is None or access.ca_key_path is None:
        raise IdentityError(
            "minting a user needs the cluster CA's key, which only planes the harness started have; "
            "use service_account_access against other clusters"
        )
    ca = certs.TinyCA.load(access.ca_cert_path.read_bytes(), access.ca_key_path.read_bytes())
    pair = ca.issue_client(user, groups)
    stem = _file_stem(user)
    directory.mkdir(parents=True, exist_ok=True)
    cert, key, kubeconfig = (directory / f"{stem}{s}" for s in (".crt", ".key", ".kubeconfig"))
    for path, data in ((cert, pair.cert_pem), (key, pair.key_pem)):
        path.write_bytes(data)
        path.chmod(0o600)
    write_kubeconfig(kubeconfig, access.server_url, ca.cert_pem, user,
                     client_cert=pair.cert_pem, client_key=pair.key_pem)  # fmt: skip
    return ClusterAccess(kubeconfig, access.server_url, access.ca_cert_path, cert, key)


def service_account_access(
    access: ClusterAccess,
    namespace: str,
    name: str,
    *,
    directory: Path,
    create: bool = True,
    expiration_seconds: int = DEFAULT_TOKEN_SECONDS,
) -> ClusterAccess:
    """A kubeconfig (in ``directory``) with a TokenRequest token for ServiceAccount ``namespace/name``.

    The ServiceAccount is created first when missing and ``create`` is set.
    """
    with access.api_client() as admin:
        core = client.CoreV1Api(admin)
        if create:
            body = client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
            try:
                response_json(core.create_namespaced_service_account(namespace, body, _preload_content=False))
            except ApiException as exc:
                if exc.status != 409:
                    raise
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
        )
        response = response_json(
            core.create_namespaced_service_account_token(name, namespace, request, _preload_content=False)
        )
        token = str(response["status"]["token"])
    ca_pem = _cluster_ca(access)
    directory.mkdir(parents=True, exist_ok=True)
    kubeconfig = directory / f"{_file_stem(f'sa-{namespace}-{name}')}.kubeconfig"
    user = f"system:serviceaccount:{namespace}:{name}"
    write_kubeconfig(kubeconfig, access.server_url, ca_pem, user, token=token)
    return ClusterAccess(kubeconfig, access.server_url)


def _cluster_ca(access: ClusterAccess) -> bytes:
    """The CA that signs the API server's certificate, from the plane's files or the kubeconfig."""
    if access.ca_cert_path is not None:
        return access.ca_cert_path.read_bytes()
    import base64

    import yaml

    config = yaml.safe_load(access.kubeconfig_path.read_text(encoding="utf-8"))
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
    cluster = clusters[contexts[config["current-context"]]["cluster"]]
    if "certificate-authority-data" in cluster:
        return base64.b64decode(cluster["certificate-authority-data"])
    if "certificate-authority" in cluster:
        return Path(cluster["certificate-authority"]).read_bytes()
    raise IdentityError(f"{access.kubeconfig_path} names no certificate authority for its cluster")


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "identity"
