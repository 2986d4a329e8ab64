"""pytest wiring for the harness (entry point ``pytest11: harness``). Thin: behaviour lives in the library.

Control plane sharing (STYLE habit 14; pytest-xdist's "session fixtures once" recipe, adapted):

* The controlling process (the xdist controller, or the only process without xdist) creates a run
  directory at configure time and hands its path to every worker through ``workerinput``.
* ``control_plane`` is lazy: the first test that needs it, in whichever worker, starts the control
  plane under a file lock in that directory and records it in a JSON state file; later requests
  (other workers included) read the state. Unit-only runs never start anything.
* A worker *detaches* the control plane (it keeps running after the worker exits); the controller
  stops it in ``pytest_unconfigure``, which runs after every worker has finished: no refcount to get
  wrong when a worker crashes. Without xdist the same process starts and stops it directly.
* ``--kubeconfig PATH`` / ``HARNESS_KUBECONFIG`` uses an existing cluster instead (CRDs are applied
  to it, idempotently, since the tests need them).

The autouse leak guard snapshots after all higher-scoped fixtures are set up (pytest orders fixtures
by scope) and checks after the test's function-scoped fixtures are torn down, so only what the test
and its own fixtures left behind is blamed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

import pytest
from filelock import FileLock

from harness import guards
from harness.controlplane import ClusterAccess, ControlPlane
from harness.process import TEMP_DIR_PREFIX, sweep_orphans, temp_prefix

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

KUBECONFIG_ENV: Final = "HARNESS_KUBECONFIG"
ALLOW_LEAKS_MARKER: Final = "harness_allow_leaks"
_WORKERINPUT_KEY: Final = "epp_harness_run_dir"
_STATE_FILE: Final = "controlplane.json"
_RUN_DIR = pytest.StashKey[Path]()
_OWNS_RUN_DIR = pytest.StashKey[bool]()
_LOCAL_CONTROL_PLANE = pytest.StashKey[ControlPlane]()
_PREVIOUS_SIGTERM = pytest.StashKey[Any]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "hermetic control plane")
    group.addoption(
        "--kubeconfig",
        default=None,
        help=f"use the cluster of this kubeconfig instead of starting a control plane (env {KUBECONFIG_ENV})",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{ALLOW_LEAKS_MARKER}: do not run the harness leak guard on this test"
    )
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is not None and _WORKERINPUT_KEY in workerinput:
        config.stash[_RUN_DIR] = Path(workerinput[_WORKERINPUT_KEY])
        config.stash[_OWNS_RUN_DIR] = False
        return
    sweep_orphans(_planes_in_use())
    config.stash[_RUN_DIR] = Path(tempfile.mkdtemp(prefix=temp_prefix("run")))
    config.stash[_OWNS_RUN_DIR] = True
    _stop_on_sigterm(config)


def _planes_in_use() -> list[str]:
    """Control-plane dirs recorded by live runs (their starting worker may have exited already)."""
    in_use = []
    for state_file in Path(tempfile.gettempdir()).glob(f"{TEMP_DIR_PREFIX}*-run-*/{_STATE_FILE}"):
        owner = state_file.parent.name.removeprefix(TEMP_DIR_PREFIX).split("-", 1)[0]
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.kill(int(owner), 0)  # raises if the run's owner is gone: then nothing is in use
            in_use.append(str(json.loads(state_file.read_text())["root"]))
    return in_use


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: tell each worker where the shared control-plane state lives."""
    node.workerinput[_WORKERINPUT_KEY] = str(node.config.stash[_RUN_DIR])


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's owner stops the shared control plane (workers have all exited by now)."""
    if not config.stash.get(_OWNS_RUN_DIR, False):
        return
    run_dir = config.stash[_RUN_DIR]
    try:
        local = config.stash.get(_LOCAL_CONTROL_PLANE, None)
        if local is not None:
            local.stop()
        state_file = run_dir / _STATE_FILE
        if state_file.exists():
            state = json.loads(state_file.read_text())
            if "processes" in state:
                ControlPlane.stop_detached(state)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        previous = config.stash.get(_PREVIOUS_SIGTERM, None)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stop_on_sigterm(config: pytest.Config) -> None:
    """Turn SIGTERM into KeyboardInterrupt so pytest unwinds and ``pytest_unconfigure`` still cleans up."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    with contextlib.suppress(ValueError):  # not the main thread
        config.stash[_PREVIOUS_SIGTERM] = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config) -> ClusterAccess:
    """Access to the run's API server: started once per run (shared by xdist workers), or external."""
    external = pytestconfig.getoption("kubeconfig") or os.environ.get(KUBECONFIG_ENV)
    if external:
        access = ClusterAccess.from_kubeconfig(Path(external))
        _install_crds_if_available(access)
        return access
    return _shared_control_plane(pytestconfig)


def _shared_control_plane(config: pytest.Config) -> ClusterAccess:
    run_dir = config.stash[_RUN_DIR]
    state_file = run_dir / _STATE_FILE
    with FileLock(str(run_dir / "controlplane.lock")):
        if state_file.exists():
            state = json.loads(state_file.read_text())
            if "error" in state:  # a previous start failed: do not spend another minute per worker
                pytest.fail(
                    f"control plane failed to start earlier in this run:\n{state['error']}", pytrace=False
                )
            return ClusterAccess.from_json(state["access"])
        plane = ControlPlane()
        try:
            plane.start()
        except Exception as exc:
            _write_json(state_file, {"error": str(exc)})
            raise
        if config.stash[_OWNS_RUN_DIR]:
            config.stash[_LOCAL_CONTROL_PLANE] = plane
            state = {"access": plane.access.to_json()}
        else:
            state = plane.detach()
        _write_json(state_file, state)
        return ClusterAccess.from_json(state["access"])


def _install_crds_if_available(access: ClusterAccess) -> None:
    try:
        from harness import crds
    except ModuleNotFoundError as exc:
        if exc.name != "harness.crds":
            raise
        return
    with access.api_client() as api_client:
        crds.install_crds(api_client)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)


@pytest.fixture
def kube_api(control_plane: ClusterAccess) -> Iterator[ApiClient]:
    """A fresh admin ``kubernetes.client.ApiClient`` for this test, closed afterwards."""
    api_client = control_plane.api_client()
    try:
        yield api_client
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def namespace(kube_api: ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new namespace for this test. Deleted at teardown without waiting: with no namespace
    controller it would stay Terminating forever, so names are never reused."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = namespace_name(request.node.name)
    core = client.CoreV1Api(kube_api)
    metadata = client.V1ObjectMeta(name=name, labels={"epp-harness/test": "true"})
    core.create_namespace(client.V1Namespace(metadata=metadata))
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name, _request_timeout=10)


def namespace_name(test_name: str) -> str:
    """A DNS-1123 label from the test name plus random hex, always unique and at most 63 chars."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:48].rstrip("-") or "test"
    return f"{slug}-{secrets.token_hex(4)}"


@pytest.fixture(autouse=True)
def _harness_leak_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves asyncio tasks, threads, child processes or harness temp dirs behind."""
    if request.node.get_closest_marker(ALLOW_LEAKS_MARKER) is not None:
        yield
        return
    before = guards.snapshot()
    yield
    leaks = guards.find_leaks(before)
    if leaks:
        guards.clean_up_leaks(before)
        pytest.fail("test left behind:\n  " + "\n  ".join(leaks), pytrace=False)
