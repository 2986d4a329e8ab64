"""The EPP image we ship, built here and run as a real container the way the chart runs it.

The container tier (opt-in: ``--containers`` or ``EPP_HARNESS_CONTAINERS=1``; README "The container
tier"): the image is built from the Containerfile on a Debian base made by debootstrap, run by the
harness's own dockerd with the chart's securityContext (the image's user 65532, a read-only root,
every capability dropped, no privilege escalation), and must serve ext_proc for its pool; a write to
``/`` fails. Stopping the engine leaves nothing on the machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from kubernetes.client import ApiClient

from harness.cluster.builders import PoolBuilder
from harness.cluster.container_engine import DockerEngine
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.kube import Kube
from harness.cluster.releases import V1, session_generation
from harness.dataplane.extproc_client import ExtProcClient
from harness.nodeagent import containerfile
from harness.nodeagent.image_builds import BuiltImages
from harness.subject.epp_container import EppContainer

pytestmark = [pytest.mark.e2e, pytest.mark.containers, pytest.mark.timeout(1200)]

POOL = "container-pool"
_WRITE_ROOT = "open('/written-by-the-epp', 'w')"


def _status_fields(status: str) -> dict[str, str]:
    return {key: value.strip() for key, _, value in (line.partition(":") for line in status.splitlines())}


def test_the_epp_image_runs_as_the_chart_runs_it_non_root_with_a_read_only_root(
    container_engine: DockerEngine,
    epp_image: BuiltImages,
    control_plane: ClusterAccess,
    kube_api: ApiClient,
    namespace: str,
) -> None:
    Kube(kube_api).pools.create(
        namespace,
        PoolBuilder(POOL)
        .selector(app="container-sim")
        .port(8000)
        .extension_ref(f"{POOL}-epp")
        .build(session_generation()),
    )
    with EppContainer(container_engine, epp_image.tag, control_plane, POOL, namespace) as epp:
        epp.wait_serving(timeout=90)
        # An ext_proc stream, as Envoy opens one (TLS, the EPP's self-signed certificate as the
        # chart runs it without tlsSecretName): the pool has no model and no pod, so the EPP
        # answers the request itself: v1alpha2 knows models only from InferenceModels (404); v1
        # routes any model name and finds no endpoint in the pool (503, naming it).
        with ExtProcClient(epp.ext_proc_address, tls=True) as client:
            answer = client.route({"model": "no-such-model", "prompt": "hi", "max_tokens": 1})
        if session_generation() is V1:
            assert answer.status == 503, answer
            assert f"InferencePool {POOL}" in answer.message, answer
        else:
            assert answer.status == 404, answer
            assert "no-such-model not found" in answer.message, answer

        # The image's own user (the Containerfile's USER; the chart only says runAsNonRoot).
        user = containerfile.image_layout(containerfile.read(containerfile.repository_containerfile())).user
        assert user == "65532:65532"
        code, status = epp.exec("cat", "/proc/1/status")
        assert code == 0, status
        fields = _status_fields(status)
        assert fields["Uid"].split() == ["65532"] * 4, fields["Uid"]
        assert fields["Gid"].split() == ["65532"] * 4, fields["Gid"]
        assert int(fields["CapEff"], 16) == 0, f"capabilities left: {fields['CapEff']}"
        assert int(fields["CapBnd"], 16) == 0, f"bounding set: {fields['CapBnd']}"
        assert fields["NoNewPrivs"] == "1"

        # A write to / fails because the root is read-only: as the EPP's user, and as root too
        # (root owns /, so only the read-only mount stops it).
        for as_user in (None, "0"):
            code, out = epp.exec("python3", "-c", _WRITE_ROOT, user=as_user)
            assert code != 0, f"a write to / succeeded (user {as_user or 'of the image'})"
            assert "Read-only file system" in out, out
        # /tmp is the chart's in-memory emptyDir: writable.
        code, out = epp.exec("python3", "-c", "open('/tmp/scratch', 'w').write('x')")
        assert code == 0, out

        inspected = json.loads(container_engine.docker("inspect", epp.name))[0]["HostConfig"]
        assert inspected["ReadonlyRootfs"] is True
        assert inspected["CapDrop"] == ["ALL"]
        assert inspected["NetworkMode"] == "host"
        # Still serving after all that: the checks did not disturb it.
        assert epp.health() == "SERVING"
    listed = container_engine.docker("ps", "-aq", "--filter", f"name={epp.name}").split()
    assert not listed, "the EPP container outlived close()"


def _net_devices() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir()}


def _iptables_rules() -> str:
    try:
        result = subprocess.run(["iptables", "-S"], capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        return ""
    return result.stdout


def _sleep_rootfs(into: Path) -> Path:
    """A root filesystem of ``/bin/sleep`` and the libraries it links (an image of a few MB)."""
    sleep = Path(shutil.which("sleep") or "/bin/sleep").resolve()
    listed = subprocess.run(["ldd", str(sleep)], capture_output=True, text=True, check=True).stdout
    libraries = [Path(word) for word in listed.split() if word.startswith("/")]
    archive = into / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        for path in (sleep, *libraries):
            tar.add(path.resolve(), arcname=str(path).lstrip("/"))
        tar.add(sleep, arcname="sleep")
    return archive


@pytest.mark.usefixtures("container_engine")  # the tier is on and an engine can run here
def test_a_stopped_engine_leaves_nothing_behind(tmp_path: Path) -> None:
    """A second engine of its own (a temporary data root), stopped with a container still running."""
    devices, rules = _net_devices(), _iptables_rules()
    engine = DockerEngine().start()
    try:
        where = engine.dir
        assert where is not None
        engine.docker("import", _sleep_rootfs(tmp_path), "epp-harness-test/sleep:1")
        engine.docker("run", "--detach", "--network", "none", "epp-harness-test/sleep:1", "/sleep", "600")
        assert engine.docker("ps", "-q").split(), "the container is not running"
    finally:
        leftovers = engine.stop()
    assert not leftovers, leftovers
    assert not engine.leftovers(where), "the engine's directory, mounts or processes remain"
    assert _net_devices() == devices, "the engine added network devices"
    assert _iptables_rules() == rules, "the engine changed iptables"
