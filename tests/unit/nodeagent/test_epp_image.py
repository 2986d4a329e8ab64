"""The EPP's image for the node agent: the Containerfile's ENTRYPOINT, the pod's network address, and
the projected ServiceAccount volume (token, CA, namespace) with its renewal before expiry."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from epp.k8s.config import load_config
from harness.base.eventually import eventually_async
from harness.cluster.certs import TinyCA
from harness.nodeagent import containerfile
from harness.nodeagent.api import PodGone
from harness.nodeagent.epp_image import AGENT_IMAGES, EppRuntime
from harness.nodeagent.images import ContainerConfigError, LaunchContext
from harness.nodeagent.runtime import Executable
from harness.nodeagent.serviceaccount import ProjectedServiceAccount, ServiceAccountVolumeError

CA_PEM = TinyCA().cert_pem.decode()
POD = {
    "metadata": {"name": "epp-0", "namespace": "pools", "uid": "u-1"},
    "spec": {"serviceAccountName": "vllm-epp"},
}


class FakeApi:
    """TokenRequests and the root-CA ConfigMap, answered in order; records what was asked."""

    def __init__(self, configmap_misses: int = 0) -> None:
        self.tokens: list[tuple[str, str, int]] = []
        self.configmap_misses = configmap_misses
        self.now = 1_000_000.0

    async def request_token(
        self, namespace: str, service_account: str, pod: Mapping[str, Any], expiration_seconds: int
    ) -> dict[str, Any]:
        self.tokens.append((namespace, service_account, expiration_seconds))
        expiry = datetime.fromtimestamp(self.now + expiration_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"token": f"token-{len(self.tokens)}", "expirationTimestamp": expiry}

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any]:
        if self.configmap_misses:
            self.configmap_misses -= 1
            raise PodGone(f"configmaps {name} not found")
        assert name == "kube-root-ca.crt"
        return {"data": {"ca.crt": CA_PEM}}


def launch_context(tmp_path: Path, api: Any, pod: Any = POD) -> tuple[LaunchContext, list[str]]:
    started: list[str] = []

    def run_alongside(work: Coroutine[Any, Any, None], name: str) -> None:
        work.close()  # the renewal loop is tested on its own below
        started.append(name)

    context = LaunchContext(pod=pod, pod_ip="127.0.9.9", workdir=tmp_path, api_server_host="127.0.0.1",
                            api_server_port="6443", api=api, run_alongside=run_alongside)  # fmt: skip
    return context, started


def test_the_chart_image_runs_the_containerfile_entrypoint_with_the_containers_args(tmp_path: Path) -> None:
    runtime = AGENT_IMAGES.resolve("ghcr.io/example/inference-epp:0.1.0")
    assert isinstance(runtime, EppRuntime)
    api = FakeApi()
    context, started = launch_context(tmp_path, api)
    command = asyncio.run(runtime.prepare({"name": "epp", "args": ["--poolName", "p"]}, context))
    layout = containerfile.image_layout(containerfile.read(containerfile.repository_containerfile()))
    assert isinstance(command, Executable)
    assert Path(command.argv[0]).name == layout.entrypoint[0] == "epp"
    assert command.argv[1:] == ("--bindAddress", "127.0.9.9", "--debugBindAddress", "127.0.9.9",
                                "--poolName", "p")  # fmt: skip
    env = dict(command.env)
    assert {k: env[k] for k, _ in layout.env} == dict(layout.env), "the image's ENV"
    sa_dir = Path(env["EPP_SERVICE_ACCOUNT_DIR"])
    assert (sa_dir / "token").read_text() == "token-1"
    assert (sa_dir / "namespace").read_text() == "pools"
    assert (sa_dir / "ca.crt").read_text() == CA_PEM
    assert api.tokens == [("pools", "vllm-epp", 3607)]
    assert started == ["token renewal"]
    # what the EPP makes of it: the in-cluster configuration, from the directory the variable names
    config = load_config(
        "", {**env, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    )
    assert config.server == "https://127.0.0.1:6443"
    assert config.namespace == "pools"
    assert config.authorization() == "Bearer token-1"


def test_no_token_when_the_pod_opts_out(tmp_path: Path) -> None:
    api = FakeApi()
    pod = {**POD, "spec": {**POD["spec"], "automountServiceAccountToken": False}}
    context, started = launch_context(tmp_path, api, pod)
    command = asyncio.run(EppRuntime().prepare({"name": "epp"}, context))
    assert isinstance(command, Executable)
    assert "EPP_SERVICE_ACCOUNT_DIR" not in dict(command.env)
    assert api.tokens == []
    assert started == []


def test_a_missing_root_ca_is_waited_for(tmp_path: Path) -> None:
    api = FakeApi(configmap_misses=2)  # the root-CA publisher has not reached a new namespace yet
    volume = ProjectedServiceAccount(api, POD, tmp_path / "sa")
    asyncio.run(volume.write(within=10))
    assert (tmp_path / "sa" / "ca.crt").exists()


def test_a_root_ca_that_never_comes_is_a_container_config_error(tmp_path: Path) -> None:
    api = FakeApi(configmap_misses=1000)
    volume = ProjectedServiceAccount(api, POD, tmp_path / "sa")
    with pytest.raises(ServiceAccountVolumeError, match=r"kube-root-ca\.crt not found"):
        asyncio.run(volume.write(within=0.5))


def test_an_unreadable_containerfile_is_a_container_config_error(tmp_path: Path) -> None:
    with pytest.raises(ContainerConfigError, match="cannot read the image layout"):
        EppRuntime(containerfile_path=tmp_path / "absent").layout()


def test_the_token_is_renewed_after_80_percent_of_its_life_and_replaced_atomically(tmp_path: Path) -> None:
    api = FakeApi()
    clock = [api.now]
    volume = ProjectedServiceAccount(
        api, POD, tmp_path / "sa", expiration_seconds=600, clock=lambda: clock[0]
    )

    async def scenario() -> None:
        await volume.write()
        assert volume.refresh_at == pytest.approx(api.now + 480)
        first_inode = volume.token_path.stat().st_ino
        clock[0] = api.now = api.now + 480  # 80% of the lifetime later
        renewal = asyncio.create_task(volume.keep_fresh())

        async def renewed() -> None:
            assert volume.renewals, "no renewal yet"

        try:
            await eventually_async(renewed, timeout=10, message="the token renewed")
        finally:
            renewal.cancel()
        await asyncio.gather(renewal, return_exceptions=True)
        assert volume.renewals == 1
        assert volume.token_path.read_text() == "token-2"
        assert volume.token_path.stat().st_ino != first_inode, "a new file renamed into place"
        assert volume.refresh_at == pytest.approx(api.now + 480)

    asyncio.run(scenario())
    assert not list((tmp_path / "sa").glob(".*.tmp"))
