"""Kubeconfig and in-cluster configuration, and a TLS round trip with a client certificate."""

from __future__ import annotations

import base64
import os
import ssl
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.k8s.client import PODS, KubeClient
from epp.k8s.config import KubeConfig, load_config, load_incluster_config, load_kubeconfig
from epp.k8s.errors import KubeConfigError
from harness.cluster.builders import PodBuilder
from harness.cluster.certs import CertKeyPair, TinyCA

from .fake_apiserver import POD_PATH, FakeApiServer
from .support import run


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    path: Path, server: str, cluster: dict[str, Any], user: dict[str, Any], namespace: str = ""
) -> Path:
    context: dict[str, Any] = {"cluster": "c1", "user": "u1"}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx1",
        "clusters": [
            {"name": "decoy", "cluster": {"server": "https://decoy.invalid"}},
            {"name": "c1", "cluster": {"server": server, **cluster}},
        ],
        "users": [{"name": "u1", "user": user}],
        "contexts": [
            {"name": "decoy", "context": {"cluster": "decoy", "user": "u1"}},
            {"name": "ctx1", "context": context},
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def pki() -> tuple[TinyCA, CertKeyPair, CertKeyPair]:
    ca = TinyCA()
    return ca, ca.issue_serving(["localhost"], ["127.0.0.1"]), ca.issue_client("epp", ["system:masters"])


def test_current_context_with_inline_data_and_token(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair]
) -> None:
    ca, _, client = pki
    path = kubeconfig(
        tmp_path / "config",
        "https://127.0.0.1:6443/",
        {"certificate-authority-data": b64(ca.cert_pem)},
        {
            "client-certificate-data": b64(client.cert_pem),
            "client-key-data": b64(client.key_pem),
            "token": "abc",
        },
        namespace="team",
    )
    config = load_kubeconfig(path)
    assert config.server == "https://127.0.0.1:6443"
    assert config.namespace == "team"
    assert config.authorization() == "Bearer abc"
    assert isinstance(config.ssl_context, ssl.SSLContext)
    assert config.ssl_context.verify_mode == ssl.CERT_REQUIRED


def test_file_references_are_relative_to_the_kubeconfig(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair]
) -> None:
    ca, _, client = pki
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_bytes(ca.cert_pem)
    (tmp_path / "pki" / "client.crt").write_bytes(client.cert_pem)
    (tmp_path / "pki" / "client.key").write_bytes(client.key_pem)
    (tmp_path / "pki" / "token").write_text("rotating-1\n")
    path = kubeconfig(
        tmp_path / "config",
        "https://127.0.0.1:6443",
        {"certificate-authority": "pki/ca.crt"},
        {"client-certificate": "pki/client.crt", "client-key": "pki/client.key", "tokenFile": "pki/token"},
    )
    config = load_kubeconfig(path)
    assert config.namespace == "default"
    assert config.authorization() == "Bearer rotating-1"
    (tmp_path / "pki" / "token").write_text("rotating-2\n")
    assert config.authorization() == "Bearer rotating-2"  # re-read: projected tokens rotate


def test_named_context_overrides_current(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", "http://127.0.0.1:8080", {}, {})
    assert load_kubeconfig(path, context="decoy").server == "https://decoy.invalid"
    assert load_kubeconfig(path).ssl_context is None  # plain http


@pytest.mark.parametrize(
    ("cluster", "user", "context", "says"),
    [
        pytest.param(
            {}, {}, "missing", r"^kubeconfig .*/config: no context named 'missing'$", id="unknown-context"
        ),
        pytest.param(
            {"certificate-authority": "nope.crt"},
            {},
            None,
            r"^cannot read certificate-authority nope.crt: ",
            id="missing-ca-file",
        ),
        pytest.param(
            {"certificate-authority-data": b64(b"garbage")},
            {},
            None,
            r"^invalid certificate authority: ",
            id="invalid-ca",
        ),
        pytest.param(
            {},
            {"client-certificate-data": b64(b"x")},
            None,
            r"^client certificate and key must be given together$",
            id="cert-without-key",
        ),
        pytest.param(
            {},
            {"client-key-data": b64(b"x")},
            None,
            r"^client certificate and key must be given together$",
            id="key-without-cert",
        ),
        pytest.param(
            {},
            {"client-certificate-data": b64(b"x"), "client-key-data": b64(b"y")},
            None,
            r"^invalid client certificate or key: ",
            id="unloadable-client-pair",
        ),
        pytest.param(
            {"server": ""},
            {},
            None,
            r"cluster of context 'ctx1' has no server$",
            id="no-server",
        ),
    ],
)
def test_bad_kubeconfig_is_a_config_error_that_says_what_is_wrong(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], context: str | None, says: str
) -> None:
    path = kubeconfig(tmp_path / "config", "https://127.0.0.1:6443", cluster, user)
    with pytest.raises(KubeConfigError, match=says):
        load_kubeconfig(path, context=context)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("- just\n- a list\n", r"is not a mapping$", id="not-a-mapping"),
        pytest.param("a: [unclosed\n", r"^cannot read kubeconfig .*config: ", id="not-yaml"),
        pytest.param(
            "contexts: [{name: c, context: {cluster: c}}]\n",
            r"^kubeconfig .*/config: no context named ''$",
            id="no-current-context",
        ),
        pytest.param(
            "current-context: c\ncontexts: [{name: c, context: {user: u}}]\n",
            r"^kubeconfig .*/config: no cluster named ''$",
            id="context-without-a-cluster",
        ),
        pytest.param(
            "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
            "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n",
            r"^kubeconfig .*/config: no user named 'u'$",
            id="unknown-user",
        ),
        pytest.param(
            "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n"
            "clusters: [{name: k, cluster: {certificate-authority-data: ''}}]\n",
            r"^kubeconfig .*/config: cluster of context 'c' has no server$",
            id="cluster-without-a-server",
        ),
    ],
)
def test_a_kubeconfig_that_is_not_one_is_a_config_error(tmp_path: Path, text: str, says: str) -> None:
    """Also: references that lead nowhere, each error naming the file and what it looked for."""
    (tmp_path / "config").write_text(text)
    with pytest.raises(KubeConfigError, match=says):
        load_kubeconfig(tmp_path / "config")


def test_insecure_skip_tls_verify_and_the_tls_server_name(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "config",
        "https://127.0.0.1:6443",
        {"insecure-skip-tls-verify": True, "tls-server-name": "kubernetes.default"},
        {},
    )
    config = load_kubeconfig(path)
    assert config.ssl_context is not None
    assert (config.ssl_context.check_hostname, config.ssl_context.verify_mode) == (False, ssl.CERT_NONE)
    assert config.tls_server_name == "kubernetes.default"
    secure = load_kubeconfig(kubeconfig(tmp_path / "secure", "https://127.0.0.1:6443", {}, {}))
    assert secure.ssl_context is not None
    assert (secure.ssl_context.check_hostname, secure.ssl_context.verify_mode) == (True, ssl.CERT_REQUIRED)
    assert secure.tls_server_name == ""


def test_inline_data_wins_over_a_file_reference(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair]
) -> None:
    """kubectl's rule: `certificate-authority-data` is used and `certificate-authority` never read."""
    ca, _, _ = pki
    path = kubeconfig(
        tmp_path / "config",
        "https://127.0.0.1:6443",
        {"certificate-authority-data": b64(ca.cert_pem), "certificate-authority": "absent.crt"},
        {},
    )
    assert load_kubeconfig(path).ssl_context is not None


def test_a_context_without_a_user_authenticates_with_nothing(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", "http://127.0.0.1:8080", {}, {"token": "never-used"})
    doc = yaml.safe_load(path.read_text())
    del doc["contexts"][1]["context"]["user"]
    path.write_text(yaml.safe_dump(doc))
    config = load_kubeconfig(path)
    assert (config.authorization(), config.token, config.token_file) == (None, "", "")


def service_account(tmp_path: Path, ca: TinyCA) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    (sa / "ca.crt").write_bytes(ca.cert_pem)
    (sa / "namespace").write_text("epp-system")
    return sa


@pytest.mark.parametrize(
    ("host", "server"),
    [
        pytest.param("10.96.0.1", "https://10.96.0.1:443", id="ipv4"),
        pytest.param("fd00::1", "https://[fd00::1]:443", id="ipv6"),
    ],
)
def test_in_cluster(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair], host: str, server: str
) -> None:
    sa = service_account(tmp_path, pki[0])
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": "443"}
    config = load_incluster_config(env, sa_dir=sa)
    assert config.server == server
    assert config.namespace == "epp-system"
    assert config.authorization() == "Bearer sa-token"


def test_in_cluster_reads_the_service_account_dir_override_and_follows_a_rotated_token(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair]
) -> None:
    """The harness's node agent writes the pod's token elsewhere and rotates it by atomic rename."""
    sa = service_account(tmp_path, pki[0])
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443",
           "EPP_SERVICE_ACCOUNT_DIR": str(sa)}  # fmt: skip
    config = load_config("", env, home=tmp_path / "nobody")
    assert config.namespace == "epp-system"
    assert config.authorization() == "Bearer sa-token"
    (sa / "token.new").write_text("rotated-token")
    (sa / "token.new").replace(sa / "token")
    assert config.authorization() == "Bearer rotated-token"


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="nothing"),
        pytest.param({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, id="no-port"),
        pytest.param({"KUBERNETES_SERVICE_PORT": "443"}, id="no-host"),
    ],
)
def test_in_cluster_outside_a_cluster_is_a_config_error(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(
        KubeConfigError, match=r"^KUBERNETES_SERVICE_HOST/PORT are not set: not running in a cluster$"
    ):
        load_incluster_config(env, sa_dir=tmp_path)


@pytest.mark.parametrize("missing", ["token", "ca.crt"])
def test_in_cluster_without_the_token_or_the_ca_is_a_config_error(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair], missing: str
) -> None:
    sa = service_account(tmp_path, pki[0])
    (sa / missing).unlink()
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match=f"^service-account token or CA missing under {sa}$"):
        load_incluster_config(env, sa_dir=sa)


def test_in_cluster_without_a_namespace_file_is_in_default(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair]
) -> None:
    sa = service_account(tmp_path, pki[0])
    (sa / "namespace").unlink()
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_incluster_config(env, sa_dir=sa)
    assert config.namespace == "default"
    assert config.ssl_context is not None
    assert (config.ssl_context.check_hostname, config.ssl_context.verify_mode) == (True, ssl.CERT_REQUIRED)


def test_in_cluster_trusts_the_cluster_ca_and_nothing_else(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair]
) -> None:
    """The API server's certificate is checked against the service account's ca.crt, not the
    system's store (which would trust any public CA's certificate for the API server's address)."""
    sa = service_account(tmp_path, pki[0])
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_incluster_config(env, sa_dir=sa)
    assert config.ssl_context is not None
    expected = ssl.create_default_context(cadata=pki[0].cert_pem.decode()).get_ca_certs()
    assert config.ssl_context.get_ca_certs() == expected


def test_load_config_order(tmp_path: Path) -> None:
    explicit = kubeconfig(tmp_path / "explicit", "http://127.0.0.1:1", {}, {})
    from_env = kubeconfig(tmp_path / "from-env", "http://127.0.0.1:2", {}, {})
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    kubeconfig(home / ".kube" / "config", "http://127.0.0.1:3", {}, {})
    env = {"KUBECONFIG": f"{tmp_path / 'absent'}:{from_env}"}

    assert load_config(str(explicit), env, home=home).server.endswith(":1")
    assert load_config("", env, home=home).server.endswith(":2")
    assert load_config("", {}, home=home).server.endswith(":3")
    assert load_config("", {"KUBECONFIG": f":{from_env}:"}, home=home).server.endswith(":2")  # empty entries
    # In a pod, the service account comes before a stray ~/.kube/config (no sa dir here: its error says so).
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
              "EPP_SERVICE_ACCOUNT_DIR": str(tmp_path / "no-sa")}  # fmt: skip
    with pytest.raises(KubeConfigError, match="service-account token or CA missing"):
        load_config("", in_pod, home=home)
    with pytest.raises(
        KubeConfigError,
        match=r"^no kubeconfig given, \$KUBECONFIG unset, not in a cluster, no ~/.kube/config$",
    ):
        load_config("", {}, home=tmp_path / "nobody")


def test_tls_round_trip_with_client_certificate(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair]
) -> None:
    ca, serving, client = pki
    (tmp_path / "srv.crt").write_bytes(serving.cert_pem)
    (tmp_path / "srv.key").write_bytes(serving.key_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=ca.cert_pem.decode())
    server_ctx.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")
    server_ctx.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no answer

    async def main() -> None:
        async with FakeApiServer(ssl_context=server_ctx) as server:
            server.upsert(POD_PATH, PodBuilder("p1").namespace("ns1").build())
            path = kubeconfig(
                tmp_path / "config",
                server.url,
                {"certificate-authority-data": b64(ca.cert_pem)},
                {"client-certificate-data": b64(client.cert_pem), "client-key-data": b64(client.key_pem)},
            )
            config: KubeConfig = load_kubeconfig(path)
            async with KubeClient(config) as kube:
                items, _ = await kube.list(PODS, "ns1")
            assert [i["metadata"]["name"] for i in items] == ["p1"]

    run(main)


def test_only_trailing_slashes_are_stripped_from_the_server_url(tmp_path: Path) -> None:
    """The server URL is used as a prefix for every request path: the slashes that end it go, and
    nothing else (a path behind a proxy may well end in a capital letter)."""
    path = kubeconfig(tmp_path / "config", "https://10.0.0.1:6443/k8s/clusters/C-XX//", {}, {})
    assert load_kubeconfig(path).server == "https://10.0.0.1:6443/k8s/clusters/C-XX"


def test_with_kubeconfig_unset_no_file_but_the_home_one_is_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$KUBECONFIG unset (or empty) names no file: nothing in the working directory is looked at, so a
    stray file there never decides which cluster the EPP watches; ~/.kube/config is the only candidate."""
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    kubeconfig(home / ".kube" / "config", "http://127.0.0.1:3", {}, {})
    monkeypatch.chdir(tmp_path)
    looked_at: list[Path] = []
    exists = Path.exists

    def recording_exists(self: Path, *args: Any, **kwargs: Any) -> bool:
        looked_at.append(self)
        return exists(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", recording_exists)
    for env in ({}, {"KUBECONFIG": ""}):
        looked_at.clear()
        assert load_config("", env, home=home).server == "http://127.0.0.1:3"
        assert looked_at == [home / ".kube" / "config"], env


def test_the_client_key_is_written_for_its_owner_only_to_a_named_temp_dir_then_removed(
    tmp_path: Path, pki: tuple[TinyCA, CertKeyPair, CertKeyPair], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ssl loads a client certificate only from files, so the inline pair is written out for the
    moment it takes: the key readable by its owner alone (whatever the umask lets through), in a
    private directory whose name says whose it is (should a killed process leave it behind), gone
    once loaded."""
    _, _, client = pki
    seen: list[tuple[Path, Path, int, int]] = []
    load_cert_chain = ssl.SSLContext.load_cert_chain

    def recording_load(
        self: ssl.SSLContext, certfile: Any, keyfile: Any = None, password: Any = None
    ) -> None:
        cert, key = Path(certfile), Path(keyfile)
        seen.append((cert, key, stat.S_IMODE(key.stat().st_mode), stat.S_IMODE(key.parent.stat().st_mode)))
        load_cert_chain(self, certfile, keyfile, password)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", recording_load)
    path = kubeconfig(
        tmp_path / "config",
        "https://127.0.0.1:6443",
        {},
        {"client-certificate-data": b64(client.cert_pem), "client-key-data": b64(client.key_pem)},
    )
    umask = os.umask(0o022)  # a usual umask, which would let a group or other bit through
    try:
        load_kubeconfig(path)
    finally:
        os.umask(umask)
    [(cert, key, key_mode, dir_mode)] = seen
    assert (key_mode, dir_mode) == (0o600, 0o700)
    assert cert.parent == key.parent
    assert key.parent.name.startswith("epp-kubeconfig-"), key.parent.name
    assert (cert.name, key.name) == ("client.crt", "client.key")
    assert not key.parent.exists()
