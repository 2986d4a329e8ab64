"""End-to-end lifecycles: ``harness up`` as a user runs it, and a ``pytest -n 2`` run sharing one plane.

Both start their own control plane in a child process and check that nothing of it survives.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.base import guards
from harness.base.binaries import CACHE_ENV, cache_root, kubectl_path
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.go_binaries import KUBERNETES_VERSION

pytestmark = pytest.mark.integration

START_TIMEOUT = 120.0


class LineReader:
    """Reads a child's merged output on a thread (joined in ``close``) so waits can have deadlines."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._stream = process.stdout
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._pump, name="line-reader", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for line in self._stream:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def until(self, marker: str, timeout: float) -> list[str]:
        while not any(marker in line for line in self.seen):
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                output = "\n".join(self.seen)
                raise AssertionError(f"no {marker!r} within {timeout}s; output so far:\n{output}") from None
            if line is None:
                raise AssertionError(f"output ended before {marker!r}:\n" + "\n".join(self.seen))
            self.seen.append(line)
        return self.seen

    def close(self) -> None:
        self._thread.join(timeout=30)
        self._stream.close()


def _fields(lines: list[str]) -> dict[str, str]:
    fields = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.isidentifier():
            fields[key] = value.strip()
    return fields


def _assert_gone(pids: list[int]) -> None:
    alive = [c for c in guards.child_processes() if c.pid in pids]
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        assert state == "Z", f"process {pid} survived: {alive}"


def _component(command: str) -> str:
    """The binary's name, or the module a ``python -m`` runs."""
    argv = command.split()
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1]
    return Path(argv[0]).name


def test_harness_up_prints_a_working_kubectl_line_and_stops_on_sigint() -> None:
    harness_cli = Path(sys.executable).parent / "harness"
    process = subprocess.Popen(
        [str(harness_cli), "up"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    reader = LineReader(process)
    try:
        fields = _fields(reader.until("Press Ctrl-C", START_TIMEOUT))
        command = shlex.split(fields["kubectl"])
        assert command[0] == str(kubectl_path())
        printed = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert printed.returncode == 0, printed.stderr

        kubeconfig = Path(fields["kubeconfig"])
        version = subprocess.run(
            [command[0], "--kubeconfig", str(kubeconfig), "version", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(version.stdout)["serverVersion"]["gitVersion"] == f"v{KUBERNETES_VERSION}"

        children = guards.child_processes(process.pid)
        names = sorted(_component(c.command) for c in children)
        assert names == [
            "etcd",
            "harness.nodeagent",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ]
        [agent] = [c for c in children if _component(c.command) == "harness.nodeagent"]
        children += guards.child_processes(agent.pid)  # its container launcher: in the group, stopped too

        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, "\n".join(reader.seen)
        _assert_gone([c.pid for c in children])
        assert not kubeconfig.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.close()


INNER_TESTS = """
import json, os
from pathlib import Path
import pytest

def plane_parents(kubeconfig):
    # {component: parent pid} of the processes running in the plane's directory; a component is the
    # binary's name, or the module `python -m` runs (whatever the interpreter's file is called)
    root = str(Path(kubeconfig).parent).encode()
    parents = {}
    for entry in os.scandir("/proc"):
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\\0")
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if any(root in arg for arg in argv[1:]):
            module = argv[argv.index(b"-m") + 1].decode() if b"-m" in argv[1:-1] else None
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            parents[module or Path(argv[0].decode()).name] = parent
    return parents

@pytest.mark.parametrize("n", range(6))
def test_uses_the_shared_plane(control_plane, namespace, n):
    record = {
        "plane_parents": plane_parents(control_plane.kubeconfig_path),
        "worker": os.environ.get("PYTEST_XDIST_WORKER"),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "server": control_plane.server_url,
        "kubeconfig": str(control_plane.kubeconfig_path),
        "namespace": namespace,
    }
    Path(__file__).with_name(f"record-{n}.json").write_text(json.dumps(record))
"""


@pytest.fixture(scope="session")
def real_cache_root() -> Path:
    """The harness cache as seen before pytester points HOME at its temp dir (session scope: set up first)."""
    return cache_root()


def test_xdist_run_shares_one_control_plane_and_leaves_nothing(
    real_cache_root: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # keep the real cache (kube-apiserver binary, port locks) for the inner run
    monkeypatch.setenv(CACHE_ENV, str(real_cache_root))
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=6)
    output = result.stdout.str() + result.stderr.str()
    assert "ResourceWarning" not in output, output

    records = [json.loads(p.read_text()) for p in sorted(pytester.path.glob("record-*.json"))]
    assert len(records) == 6
    assert {r["worker"] for r in records} == {"gw0", "gw1"}
    assert len({r["server"] for r in records}) == 1  # one control plane for both workers
    assert len({r["namespace"] for r in records}) == 6  # a fresh namespace per test
    # The plane's processes are children of the xdist controller, which stops and reaps them: never
    # of a worker, which would exit with them still running (and Python would warn at its exit:
    # "ResourceWarning: subprocess N is still running").
    (controller,) = {r["ppid"] for r in records}
    for record in records:
        assert record["plane_parents"] == dict.fromkeys(
            ["etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "harness.nodeagent"],
            controller,
        )

    plane_dir = str(Path(records[0]["kubeconfig"]).parent)
    assert not os.path.exists(plane_dir)
    survivors = [p for p in _cmdlines() if plane_dir in p]
    assert survivors == [], survivors  # no etcd / kube-apiserver of the run is left
    for pid in {r["pid"] for r in records} | {r["ppid"] for r in records}:
        assert guards.harness_temp_dirs(pid) == []


def _cmdlines() -> list[str]:
    lines = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                lines.append(Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return lines


EXTERNAL_TESTS = """
from pathlib import Path

def test_uses_the_given_cluster(control_plane, namespace):
    Path(__file__).with_name("server.txt").write_text(control_plane.server_url)
"""


def test_kubeconfig_option_uses_an_existing_cluster(
    real_cache_root: Path,
    control_plane: ClusterAccess,
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(real_cache_root))
    pytester.makepyfile(test_external=EXTERNAL_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kubeconfig", str(control_plane.kubeconfig_path), timeout=120
    )
    result.assert_outcomes(passed=1)
    assert (pytester.path / "server.txt").read_text() == control_plane.server_url
