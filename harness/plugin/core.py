"""pytest wiring for the harness (entry point ``pytest11: harness``). Thin: behaviour lives in the library.

Control plane sharing (STYLE habit 14). One full control plane per run, started lazily by the first
test that needs it (unit-only runs never start anything), stopped by the process that started it:

* Without xdist, the test process starts it and stops it in ``pytest_unconfigure``.
* Under xdist the *controller* owns it: a worker asks the controller for it over a Unix socket in
  the run directory (handed to workers through ``workerinput``); the controller starts it once, as
  its own child, answers every worker with the same access, and stops it in ``pytest_unconfigure``
  after all workers have exited. The plane's processes are children of the process that stops and
  reaps them, so no worker exits with running children (Python would warn "subprocess ... is still
  running" for each), and no refcount can go wrong when a worker crashes.
* ``--kubeconfig PATH`` / ``HARNESS_KUBECONFIG`` uses an existing cluster instead (CRDs are applied
  to it, idempotently, since the tests need them).
* With the container tier on (``harness.plugin.container_fixtures``), the plane's owner also starts
  one container engine for the run (on the kept data root: images from the last run are present),
  before the plane: the node agent runs our images in it, and every worker's ``container_engine``
  is a client of it (``run_container_engine``), so images are made ready once per run. It is
  stopped after the plane. If it cannot start, the plane starts without it and the container
  tests skip with the reason.

The autouse leak guard snapshots after all higher-scoped fixtures are set up (pytest orders fixtures
by scope) and checks after the test's function-scoped fixtures are torn down, so only what the test
and its own fixtures left behind is blamed.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import socket
import socketserver
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

import pytest

from harness.base import guards
from harness.base.process import sweep_orphans, temp_prefix
from harness.cluster import releases
from harness.cluster.controlplane import ClusterAccess, ControlPlane
from harness.cluster.namespaces import TEST_LABEL, create_namespace, namespace_name

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from harness.cluster.container_engine import DockerEngine

__all__ = ["namespace_name"]  # re-exported: fixtures elsewhere name their namespaces with it

KUBECONFIG_ENV: Final = "HARNESS_KUBECONFIG"
ALLOW_LEAKS_MARKER: Final = "harness_allow_leaks"
# ``@pytest.mark.api_generation("v1alpha2")``: the test is about one API generation's objects (its
# CRD schema, its kinds): skipped, as not applicable, in a run on the other generation's CRDs.
GENERATION_MARKER: Final = "api_generation"
_WORKERINPUT_KEY: Final = "epp_harness_plane_socket"
_SOCKET_NAME: Final = "controlplane.sock"
_REQUEST_TIMEOUT: Final = 1800.0  # the first request may include building the binaries
_RUN_DIR = pytest.StashKey[Path]()
_OWNS_RUN_DIR = pytest.StashKey[bool]()
_PLANE_SOURCE = pytest.StashKey["_PlaneSource"]()
_SERVER = pytest.StashKey["_PlaneServer"]()
_PREVIOUS_SIGTERM = pytest.StashKey[Any]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "hermetic control plane")
    group.addoption(
        "--kubeconfig",
        default=None,
        help=f"use the cluster of this kubeconfig instead of starting a control plane (env {KUBECONFIG_ENV})",
    )
    group.addoption(
        "--crd-release",
        default=None,
        help="install the CRDs of this sigs.k8s.io/gateway-api-inference-extension release "
        "(default: $EPP_HARNESS_CRD_RELEASE, else the pinned one)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{ALLOW_LEAKS_MARKER}: do not run the harness leak guard on this test"
    )
    config.addinivalue_line(
        "markers", f"{GENERATION_MARKER}(name): only in a run on CRDs of that API generation (v1alpha2, v1)"
    )
    release = config.getoption("crd_release")
    try:
        releases.default_release() if release is None else releases.check_release(release)
    except releases.UnknownReleaseError as exc:
        raise pytest.UsageError(str(exc)) from exc
    if release is not None:  # the session's release, for everything that asks (and our EPP's group)
        os.environ[releases.CRD_RELEASE_ENV] = release
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is not None and _WORKERINPUT_KEY in workerinput:
        config.stash[_OWNS_RUN_DIR] = False
        config.stash[_PLANE_SOURCE] = _PlaneSource(_ask_controller(Path(workerinput[_WORKERINPUT_KEY])))
        return
    sweep_orphans()
    config.stash[_RUN_DIR] = Path(tempfile.mkdtemp(prefix=temp_prefix("run")))
    config.stash[_OWNS_RUN_DIR] = True
    from harness.plugin.container_fixtures import containers_enabled

    local = _LocalPlane(release, containers=containers_enabled(config))
    config.stash[_PLANE_SOURCE] = _PlaneSource(
        lambda what: local.engine() if what == _ENGINE else local.access(), local
    )
    _stop_on_sigterm(config)


@pytest.hookimpl(tryfirst=True)  # before xdist starts its workers
def pytest_sessionstart(session: pytest.Session) -> None:
    """With the container tier on, the run's owner starts the engine and makes the images ready
    before any test runs: a cold build takes minutes, more than a test's timeout, and every worker
    then finds the images present."""
    config = session.config
    if not config.stash.get(_OWNS_RUN_DIR, False) or external_cluster(config):
        return
    source = config.stash[_PLANE_SOURCE]
    if source.owner is not None:
        source.owner.prepare_images()


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker(GENERATION_MARKER)
    if marker is None:
        return
    session = releases.session_generation().name
    if marker.args[0] != session:
        pytest.skip(f"not applicable: written for API generation {marker.args[0]}, this run is {session}")


def pytest_report_header(config: pytest.Config) -> list[str]:
    release = config.getoption("crd_release") or releases.default_release()
    generation = releases.generation_of(release)
    note = releases.supplement_note(release)
    return [f"harness: CRDs of {release} (API generation {generation.name})", *([note] if note else [])]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: serve the shared control plane to this worker (the server starts once)."""
    config: pytest.Config = node.config
    server = config.stash.get(_SERVER, None)
    if server is None:
        source = config.stash[_PLANE_SOURCE]
        server = _PlaneServer(config.stash[_RUN_DIR] / _SOCKET_NAME, source)
        config.stash[_SERVER] = server
    node.workerinput[_WORKERINPUT_KEY] = str(server.path)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's owner stops the shared control plane (workers have all exited by now)."""
    if not config.stash.get(_OWNS_RUN_DIR, False):
        return
    try:
        server = config.stash.get(_SERVER, None)
        if server is not None:
            server.close()
        config.stash[_PLANE_SOURCE].close()
    finally:
        shutil.rmtree(config.stash[_RUN_DIR], ignore_errors=True)
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


# ---------------------------------------------------------------------- the shared plane


class _LocalPlane:
    """The owner's plane (and, with the container tier, the run's engine): started on first use
    (once, even when asked from several threads)."""

    def __init__(self, crd_release: str | None, containers: bool = False) -> None:
        self._crd_release = crd_release
        self._containers = containers
        self._lock = threading.Lock()
        self._plane: ControlPlane | None = None
        self._engine: DockerEngine | None = None
        self._error: str | None = None
        self._engine_error: str | None = None

    def access(self) -> dict[str, Any]:
        """``{"access": ...}`` or ``{"error": ...}`` (a failed start is not retried: it would cost a
        minute per test)."""
        with self._lock:
            if self._error is None and self._plane is None:
                self._start_engine()
                engine = self._engine.dir if self._engine is not None else None
                plane = ControlPlane(crd_release=self._crd_release, container_engine=engine)
                try:
                    plane.start()
                except Exception as exc:
                    self._error = str(exc)
                else:
                    self._plane = plane
            if self._error is not None:
                return {"error": self._error}
            assert self._plane is not None
            return {"access": self._plane.access.to_json()}

    def engine(self) -> dict[str, Any]:
        """``{"engine": directory or None, "engine_error": reason or None}``; starts only the engine."""
        with self._lock:
            self._start_engine()
            engine = self._engine.dir if self._engine is not None else None
            return {"engine": str(engine) if engine else None, "engine_error": self._engine_error}

    def prepare_images(self) -> None:
        """The engine, and every image the tier uses, ready (built on a cold cache); a failure is
        left for the fixtures to report."""
        with self._lock:
            self._start_engine()
            if self._engine is None:
                return
            from harness.plugin.container_fixtures import prepare_images

            prepare_images(self._engine)

    def _start_engine(self) -> None:
        """Once, with the container tier on (a failure is kept as the reason the tier skips)."""
        if not self._containers or self._engine is not None or self._engine_error is not None:
            return
        from harness.cluster.container_engine import EngineUnavailable
        from harness.cluster.container_images import kept_engine

        try:
            self._engine = kept_engine()
        except EngineUnavailable as exc:
            self._engine_error = str(exc)

    def close(self) -> None:
        with self._lock:
            try:
                if self._plane is not None:
                    self._plane.stop()
                    self._plane = None
            finally:
                if self._engine is not None:
                    leftovers = self._engine.stop()
                    self._engine = None
                    if leftovers:  # said where a run's output shows it, not swallowed
                        print(f"\nharness: the run's container engine left {leftovers}", file=sys.stderr)


_PLANE: Final = "control-plane"
_ENGINE: Final = "engine"


class _PlaneSource:
    """Where this process gets the plane (and the run's engine) from: its own ``_LocalPlane`` or the
    xdist controller."""

    def __init__(self, fetch: Callable[[str], dict[str, Any]], owner: _LocalPlane | None = None) -> None:
        self._fetch = fetch
        self._owner = owner

    @property
    def owner(self) -> _LocalPlane | None:
        return self._owner

    def access(self) -> ClusterAccess:
        state = self._fetch(_PLANE)
        if "error" in state:
            pytest.fail(f"the shared control plane failed to start:\n{state['error']}", pytrace=False)
        return ClusterAccess.from_json(state["access"])

    def state(self, what: str = _PLANE) -> dict[str, Any]:
        return self._fetch(what)

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()


class _PlaneServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The xdist controller's end: one JSON line per connection, the plane's access or its error."""

    daemon_threads = True
    block_on_close = True

    def __init__(self, path: Path, source: _PlaneSource) -> None:
        self.path = path
        self.source = source
        super().__init__(str(path), _PlaneRequestHandler)
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.1}, name="harness-control-plane-server"
        )
        self._thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join()


class _PlaneRequestHandler(socketserver.StreamRequestHandler):
    server: _PlaneServer

    def handle(self) -> None:
        what = self.rfile.readline().decode().strip()
        state = self.server.source.state(_ENGINE if what == _ENGINE else _PLANE)
        self.wfile.write(json.dumps(state).encode() + b"\n")


def _ask_controller(path: Path) -> Callable[[str], dict[str, Any]]:
    """A worker's end: ask the controller once for each thing (the plane, the engine), then remember
    the answer."""
    answers: dict[str, dict[str, Any]] = {}

    def fetch(what: str) -> dict[str, Any]:
        if what not in answers:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(_REQUEST_TIMEOUT)
                connection.connect(str(path))
                connection.sendall(what.encode() + b"\n")
                with connection.makefile("rb") as reply:
                    answers[what] = json.loads(reply.readline())
        return answers[what]

    return fetch


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config) -> ClusterAccess:
    """Access to the run's API server: the full plane, started once per run (shared by xdist
    workers), or an external cluster."""
    if external_cluster(pytestconfig):
        external = pytestconfig.getoption("kubeconfig") or os.environ[KUBECONFIG_ENV]
        access = ClusterAccess.from_kubeconfig(Path(external))
        from harness.cluster import crds

        with access.api_client() as api_client:
            crds.install_crds(api_client, release=pytestconfig.getoption("crd_release"))
        return access
    return pytestconfig.stash[_PLANE_SOURCE].access()


def external_cluster(config: pytest.Config) -> bool:
    return bool(config.getoption("kubeconfig") or os.environ.get(KUBECONFIG_ENV))


def run_container_engine(config: pytest.Config) -> DockerEngine | None:
    """A client of the run's container engine (the one the plane's node agent uses; started by the
    run's owner on first request, the plane not necessarily); None when the run has none (an
    external cluster, or the tier is off). Raises ``EngineUnavailable`` with the reason when it
    could not start."""
    from harness.cluster.container_engine import DockerEngine, EngineUnavailable

    if external_cluster(config):
        return None
    state = config.stash[_PLANE_SOURCE].state(_ENGINE)
    if state.get("engine_error"):
        raise EngineUnavailable(str(state["engine_error"]))
    return DockerEngine.attach(Path(state["engine"])) if state.get("engine") else None


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
    """A new namespace for this test, ready for pods (its ``default`` ServiceAccount exists when the
    cluster makes them). Deletion is requested at teardown, not awaited: the namespace controller
    finishes it in the background (a pod bound to a node without a kubelet can hold it Terminating
    for good, so names are never reused)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = namespace_name(request.node.name)
    create_namespace(kube_api, name, TEST_LABEL)
    yield name
    with contextlib.suppress(ApiException):
        response = client.CoreV1Api(kube_api).delete_namespace(
            name, _request_timeout=10, _preload_content=False
        )
        response.read()  # type: ignore[attr-defined]


@pytest.fixture
def identities(control_plane: ClusterAccess, tmp_path: Path) -> Identities:
    """Kubeconfigs for other identities than the admin: ``identities.user("alice", ["devs"])`` or
    ``identities.service_account(namespace, "reader")`` -> ``ClusterAccess`` (``.kubeconfig_path``,
    ``.api_client()``). Users need a harness plane (its CA signs them); ServiceAccount tokens come
    from the TokenRequest API (the account is created if missing)."""
    return Identities(control_plane, tmp_path / "identities")


class Identities:
    """What the ``identities`` fixture hands out (thin: ``harness.cluster.identities`` does the work)."""

    def __init__(self, access: ClusterAccess, directory: Path) -> None:
        self._access = access
        self._directory = directory

    def user(self, name: str, groups: Sequence[str] = ()) -> ClusterAccess:
        from harness.cluster.identities import user_access

        return user_access(self._access, name, groups, directory=self._directory)

    def service_account(self, namespace: str, name: str) -> ClusterAccess:
        from harness.cluster.identities import service_account_access

        return service_account_access(self._access, namespace, name, directory=self._directory)


@pytest.fixture(autouse=True)
def _harness_leak_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves asyncio tasks, threads, child processes or harness temp dirs behind.

    A test that uses the control plane (and so runs EPPs, Envoy, pods) also has its garbage
    collected at the end, so a socket or transport it left unclosed is reported (a ResourceWarning,
    an error under ``filterwarnings = error``) in its own teardown: left to the collector's next
    run, it fails whichever test happens to be running then (seen in CI: an in-process EPP's
    half-closed TLS socket reported during a later scenario on that worker). The other tests are
    left out: a collection costs tens of milliseconds, and they are thousands.
    """
    if request.node.get_closest_marker(ALLOW_LEAKS_MARKER) is not None:
        yield
        return
    before = guards.snapshot()
    yield
    leaks = guards.find_leaks(before)
    if leaks:
        guards.clean_up_leaks(before)
        pytest.fail("test left behind:\n  " + "\n  ".join(leaks), pytrace=False)
    if "control_plane" in request.fixturenames:
        gc.collect()
