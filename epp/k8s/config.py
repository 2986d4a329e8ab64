"""Where the API server is and how to authenticate: a kubeconfig file or the in-cluster service account.

The EPP must not depend on the `kubernetes` package (it is harness-only), so this reads the few
kubeconfig fields a read-only controller needs: server, CA, client certificate/key, bearer token,
and the current context. Exec/auth-provider plugins are not supported. Nothing here reads the
environment on its own: the entry point passes `os.environ` to `load_config`.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epp.k8s.errors import KubeConfigError, KubeConnectionError

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Where the in-cluster token, CA and namespace are when not at SERVICE_ACCOUNT_DIR: a node that runs
# the EPP without a container filesystem (the harness's node agent) writes them elsewhere.
SERVICE_ACCOUNT_DIR_ENV = "EPP_SERVICE_ACCOUNT_DIR"
DEFAULT_KUBECONFIG = Path(".kube") / "config"


class TokenFile:
    """A bearer token kept in a file: re-read when the file changes, a read error never fatal.

    Bound ServiceAccount tokens expire and the kubelet rotates them by swapping the projected
    volume's `..data` link, so the file is checked (one `stat`) on every request and re-read only
    when its identity, size or time changed. A read that fails after one succeeded keeps the last
    token (still valid: the kubelet rotates well before expiry) and warns once per failure streak;
    with no token read yet it raises `KubeConnectionError`, which the informer retries with backoff
    like any unreachable API server (DESIGN.md §6).
    """

    def __init__(self, path: str) -> None:
        self._path = path
        # Touched only by the API client's requests, on the event loop.
        self._token: str | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._failing = False

    def read(self) -> str:
        try:
            st = os.stat(self._path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp or self._token is None:
                self._token = Path(self._path).read_text().strip()
                self._stamp = stamp
        except OSError as exc:
            if self._token is None:
                raise KubeConnectionError(f"cannot read the bearer token file {self._path}: {exc}") from exc
            if not self._failing:
                log.warning(
                    "cannot re-read the bearer token file %s (%s); using the last token read", self._path, exc
                )
            self._failing = True
            return self._token
        if self._failing:
            log.info("bearer token file %s readable again", self._path)
            self._failing = False
        return self._token


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """How to reach one API server. `ssl_context` is None only for a plain-http server."""

    server: str
    ssl_context: ssl.SSLContext | None
    token: str = ""
    # Checked on every request: projected service-account tokens are rotated by the kubelet.
    token_file: str = ""
    tls_server_name: str = ""
    namespace: str = "default"
    _token_source: TokenFile | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.token_file:
            object.__setattr__(self, "_token_source", TokenFile(self.token_file))

    def authorization(self) -> str | None:
        """The Authorization header value, or None when authenticating by client certificate only.

        Raises `KubeConnectionError` (retryable) when the token file has never been readable.
        """
        token = self.token
        if self._token_source is not None:
            token = self._token_source.read()
        return f"Bearer {token}" if token else None


def load_config(kubeconfig: str, env: Mapping[str, str], home: Path | None = None) -> KubeConfig:
    """controller-runtime's order: explicit path, $KUBECONFIG, in-cluster, ~/.kube/config."""
    if kubeconfig:
        return load_kubeconfig(kubeconfig)
    for path in env.get("KUBECONFIG", "").split(os.pathsep):
        if path and Path(path).exists():
            return load_kubeconfig(path)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return load_incluster_config(env)
    default = (home or Path.home()) / DEFAULT_KUBECONFIG
    if default.exists():
        return load_kubeconfig(default)
    raise KubeConfigError("no kubeconfig given, $KUBECONFIG unset, not in a cluster, no ~/.kube/config")


def load_incluster_config(env: Mapping[str, str], sa_dir: Path | None = None) -> KubeConfig:
    """The pod's service account: token and CA from `sa_dir`, address from KUBERNETES_SERVICE_*.

    `sa_dir` defaults to $EPP_SERVICE_ACCOUNT_DIR, else the path every kubelet mounts. The token file
    is re-read whenever it changes (`TokenFile`): bound tokens expire and the kubelet rotates them.
    """
    if sa_dir is None:
        sa_dir = Path(env.get(SERVICE_ACCOUNT_DIR_ENV) or SERVICE_ACCOUNT_DIR)
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("KUBERNETES_SERVICE_HOST/PORT are not set: not running in a cluster")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    token_file = sa_dir / "token"
    ca_file = sa_dir / "ca.crt"
    if not token_file.exists() or not ca_file.exists():
        raise KubeConfigError(f"service-account token or CA missing under {sa_dir}")
    ns_file = sa_dir / "namespace"
    namespace = ns_file.read_text().strip() if ns_file.exists() else "default"
    return KubeConfig(
        server=f"https://{host}:{port}",
        ssl_context=_ssl_context(ca_pem=ca_file.read_text(), cert_pem=None, key_pem=None, insecure=False),
        token_file=str(token_file),
        namespace=namespace,
    )


def load_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> KubeConfig:
    """Parse a kubeconfig; relative file references are relative to the file, as kubectl does."""
    file = Path(path)
    try:
        doc = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"cannot read kubeconfig {file}: {exc}") from exc
    if not isinstance(doc, dict):
        raise KubeConfigError(f"kubeconfig {file} is not a mapping")
    ctx_name = context or doc.get("current-context") or ""
    ctx = _named(doc, "contexts", "context", ctx_name, file)
    cluster = _named(doc, "clusters", "cluster", str(ctx.get("cluster", "")), file)
    user = _named(doc, "users", "user", str(ctx.get("user", "")), file) if ctx.get("user") else {}
    base = file.parent
    server = str(cluster.get("server", "")).rstrip("/")
    if not server:
        raise KubeConfigError(f"kubeconfig {file}: cluster of context {ctx_name!r} has no server")
    ssl_ctx = None
    if server.startswith("https://"):
        ssl_ctx = _ssl_context(
            ca_pem=_text(cluster, "certificate-authority", base),
            cert_pem=_text(user, "client-certificate", base),
            key_pem=_text(user, "client-key", base),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
        )
    token_file = user.get("tokenFile") or ""
    return KubeConfig(
        server=server,
        ssl_context=ssl_ctx,
        token=str(user.get("token") or ""),
        token_file=str(base / token_file) if token_file else "",
        tls_server_name=str(cluster.get("tls-server-name") or ""),
        namespace=str(ctx.get("namespace") or "default"),
    )


def _named(doc: Mapping[str, Any], section: str, field: str, name: str, path: Path) -> Mapping[str, Any]:
    for entry in doc.get(section) or ():
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get(field) or {}
            if isinstance(value, Mapping):
                return value
    raise KubeConfigError(f"kubeconfig {path}: no {field} named {name!r}")


def _text(section: Mapping[str, Any], field: str, base: Path) -> str | None:
    """`<field>-data` (base64) wins over `<field>` (a file path), as in kubectl."""
    data = section.get(f"{field}-data")
    if data:
        return base64.b64decode(data).decode()
    file = section.get(field)
    if file:
        try:
            return (base / str(file)).read_text()
        except OSError as exc:
            raise KubeConfigError(f"cannot read {field} {file}: {exc}") from exc
    return None


def _ssl_context(
    ca_pem: str | None, cert_pem: str | None, key_pem: str | None, insecure: bool
) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()
    except ssl.SSLError as exc:
        raise KubeConfigError(f"invalid certificate authority: {exc}") from exc
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_pem and key_pem:
        # ssl can only load a client certificate from files: write them to a private temp dir.
        with tempfile.TemporaryDirectory(prefix="epp-kubeconfig-") as tmp:
            cert_file, key_file = Path(tmp) / "client.crt", Path(tmp) / "client.key"
            cert_file.write_text(cert_pem)
            key_file.touch(mode=0o600)
            key_file.write_text(key_pem)
            try:
                ctx.load_cert_chain(cert_file, key_file)
            except ssl.SSLError as exc:
                raise KubeConfigError(f"invalid client certificate or key: {exc}") from exc
    elif cert_pem or key_pem:
        raise KubeConfigError("client certificate and key must be given together")
    return ctx
