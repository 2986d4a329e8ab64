"""A container engine of the harness's own: Debian's ``docker.io``, ``dockerd`` as a supervised child.

Nothing of the machine's Docker is used or touched. The engine is one ``dockerd`` started for this
process, with everything it keeps under one harness temp dir (removed at ``stop()``):

* ``--data-root`` (images, containers, its managed containerd's content), ``--exec-root`` (its
  runtime state and containerd's sockets), ``--pidfile``, and ``-H unix://<dir>/docker.sock``: never
  the system default socket, so no other Docker on the machine (or in another xdist worker) is seen.
* No networking of its own: ``--bridge=none --iptables=false --ip-forward=false --ip-masq=false``.
  The harness's containers use ``--network host`` (bound to the pod's own loopback address, as the
  node agent does for processes) or ``--network none``, so the engine adds no bridge, no veth and no
  iptables chain to the machine; there is nothing of that kind to clean up afterwards.
* Every docker CLI call goes through ``docker()``, which sets ``DOCKER_HOST`` to this engine's socket
  and ``DOCKER_CONFIG`` to a directory of its own, and uses Debian's client (``/usr/bin/docker``),
  not whatever ``docker`` is first on ``PATH`` (``/usr/local/bin/docker`` may be a newer client
  without BuildKit's classic builder).

``ensure_packages`` installs what is missing with ``apt-get`` (idempotent: nothing runs when the
binaries are there). When the engine cannot run (not root, no apt-get, dockerd does not come up),
``EngineUnavailable`` says why: the container tier skips with that reason.

**Where images live.** By default the data root is temporary and images do not outlive the engine;
``harness.cluster.container_images`` keeps them as content-addressed tarballs in the harness cache.
``DockerEngine(persistent=True)`` (what the test tier and ``harness up --containers`` use) keeps the
data root in the cache instead (``<cache>/docker/data``), so a second run finds its images present
and neither loads nor removes hundreds of megabytes: only one engine at a time may use it (a flock
held while it runs); an engine that cannot get it falls back to a temporary data root. Nothing of
it runs or stays mounted after ``stop()``: it is a directory of files, like the tarballs.

``DockerEngine.attach(directory)`` is a client of an engine another process started and stops (an
xdist worker using the run's engine, the node agent using the plane's): its ``stop()`` does nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from harness.base.binaries import cache_root
from harness.base.lifecycle import StartStop
from harness.base.process import ChildProcesses, ManagedProcess, ProcessStartError

DOCKERD: Final = Path("/usr/sbin/dockerd")
DOCKER_CLI: Final = Path("/usr/bin/docker")  # Debian's client, whatever else PATH has
ENGINE_PACKAGES: Final[Mapping[Path, str]] = {DOCKERD: "docker.io", DOCKER_CLI: "docker.io"}
# The engine's own helpers (containerd, runc) are in /usr/bin and /usr/sbin.
_ENGINE_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_APT_TIMEOUT_S: Final = 900.0
_START_TIMEOUT_S: Final = 90.0
_STOP_TIMEOUT_S: Final = 30.0
_CLI_TIMEOUT_S: Final = 120.0
_PRUNE_TIMEOUT_S: Final = 300.0
ENGINE_LABEL: Final = "epp-harness.engine"
"""Label on every container the harness starts (its value: the engine's directory)."""


class EngineUnavailable(RuntimeError):
    """No container engine can run here; the message says why (the container tier skips with it)."""


class DockerCommandError(RuntimeError):
    """A docker CLI call failed; the message holds the command and its output."""


def persistent_data_root() -> Path:
    """The data root kept between runs (``DockerEngine(persistent=True)``)."""
    return cache_root() / "docker" / "data"


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """An exclusive flock on ``<cache>/locks/<name>.lock`` for one-time work shared by processes."""
    path = cache_root() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_packages(binaries: Mapping[Path, str]) -> list[str]:
    """Install (``apt-get``) the Debian packages providing any missing binary; the packages installed.

    Nothing runs when every binary exists. Raises ``EngineUnavailable`` when they cannot be installed.
    """
    missing = sorted({package for path, package in binaries.items() if not path.exists()})
    if not missing:
        return []
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise EngineUnavailable(f"{', '.join(missing)} missing and no apt-get to install them")
    if os.geteuid() != 0:
        raise EngineUnavailable(f"{', '.join(missing)} missing; installing them needs root (apt-get install)")
    with cache_lock("apt"):
        still = sorted({package for path, package in binaries.items() if not path.exists()})
        if not still:
            return []
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = [apt_get, "install", "-y", "-q", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300"]
        result = _run([*install, *still], env)
        if result.returncode != 0:  # a stale package list: refresh it once
            _run([apt_get, "update", "-q", "-o", "DPkg::Lock::Timeout=300"], env)
            result = _run([*install, *still], env)
        if result.returncode != 0:
            raise EngineUnavailable(
                f"apt-get install {' '.join(still)} exited {result.returncode}: {result.stdout[-2000:]}"
            )
        return still


def _run(command: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=_APT_TIMEOUT_S,
        check=False,
    )


def _ping(sock: Path) -> bool:
    """The engine's ``GET /_ping`` answers 200."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(2.0)
        conn.connect(str(sock))
        conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        head = conn.recv(64)
    return head.startswith(b"HTTP/1.") and head.split(b" ", 2)[1:2] == [b"200"]


def _ping_quietly(sock: Path) -> bool:
    try:
        return _ping(sock)
    except OSError:
        return False


@dataclass(frozen=True)
class Leftovers:
    """What an engine left on the machine after ``stop()`` (all empty when it cleaned up)."""

    mounts: tuple[str, ...]
    processes: tuple[int, ...]
    paths: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.mounts or self.processes or self.paths)


class DockerEngine(StartStop):
    """``dockerd`` with a data root, exec root, pid file and socket of its own (see the module doc)."""

    def __init__(self, *, start_timeout: float = _START_TIMEOUT_S, persistent: bool = False) -> None:
        self.start_timeout = start_timeout
        self.persistent = persistent  # asked for the cached data root (``data_root`` says if it got it)
        self._children = ChildProcesses()
        self._dockerd: ManagedProcess | None = None
        self._attached = False
        self.dir: Path | None = None
        self.data_root: Path | None = None
        self.cgroup_parent = ""

    @classmethod
    def attach(cls, directory: Path) -> DockerEngine:
        """A client of the running engine whose directory is ``directory`` (its ``stop()`` is a no-op)."""
        engine = cls()
        engine._attached = True
        engine.dir = directory
        engine.cgroup_parent = directory.name
        return engine

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        if self._attached:
            raise RuntimeError("an attached engine is started and stopped by its owner")
        ensure_packages(ENGINE_PACKAGES)
        self.dir = self._children.temp_dir("dockerd")
        self.cgroup_parent = self.dir.name
        for sub in ("exec", "config"):
            (self.dir / sub).mkdir()
        self.data_root = self._persistent_root() if self.persistent else None
        if self.data_root is None:
            self.data_root = self.dir / "data"
            self.data_root.mkdir()
        args = [
            f"--data-root={self.data_root}",
            f"--exec-root={self.dir / 'exec'}",
            f"--pidfile={self.dir / 'dockerd.pid'}",
            f"--host=unix://{self.socket}",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--userland-proxy=false",
            # Containers' cgroups under a parent of this engine's own, removed at stop (the default,
            # /docker, would be left in every hierarchy).
            f"--cgroup-parent=/{self.cgroup_parent}",
            "--storage-driver=overlay2",
            "--log-driver=json-file",
        ]
        self._dockerd = ManagedProcess(
            "dockerd",
            DOCKERD,
            args,
            dir=self.dir,
            health_check=lambda: _ping(self.socket),
            start_timeout=self.start_timeout,
            stop_timeout=_STOP_TIMEOUT_S,
            env={"PATH": _ENGINE_PATH, "HOME": str(self.dir / "config")},
        )
        self._children.defer(self._stop_dockerd)
        try:
            self._dockerd.start()
        except ProcessStartError as exc:
            raise EngineUnavailable(f"dockerd did not start: {exc}") from exc
        if self.data_root != self.dir / "data":
            self._forget_containers()  # a run that was killed may have left some in the kept root

    def _persistent_root(self) -> Path | None:
        """The cached data root, locked for this engine's life; None when another engine holds it."""
        root = persistent_data_root()
        root.parent.mkdir(parents=True, exist_ok=True)
        handle = open(root.parent / "data.lock", "wb")  # noqa: SIM115 (held until stop)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        self._children.defer(handle.close)  # closing it releases the lock, after dockerd has stopped
        root.mkdir(exist_ok=True)
        for mount in reversed(_mounts_under(root)):  # left by an engine that was killed
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        return root

    def _forget_containers(self) -> None:
        ids = self.docker("ps", "-aq").split()
        if ids:
            self.docker("rm", "-f", "-v", *ids, timeout=_PRUNE_TIMEOUT_S)

    def stop(self) -> Leftovers:
        """Remove this engine's containers, stop dockerd, undo any mount it left; what remains."""
        if self._attached:
            return Leftovers((), (), ())
        where, data_root = self.dir, self.data_root
        self._children.close()
        self.dir = self.data_root = None
        if where is None:
            return Leftovers((), (), ())
        found = self.leftovers(where)
        if data_root is not None and not data_root.is_relative_to(where):
            found = Leftovers((*found.mounts, *_mounts_under(data_root)), found.processes, found.paths)
        return found

    def _stop_dockerd(self) -> None:
        dockerd, self._dockerd = self._dockerd, None
        if dockerd is None:
            return
        if dockerd.running:
            with contextlib.suppress(DockerCommandError, subprocess.TimeoutExpired):
                ids = self.docker("ps", "-aq").split()
                if ids:
                    self.docker("rm", "-f", "-v", *ids, timeout=60)
        # dockerd alone first: it stops its own containerd in order. Signalling the whole group
        # (ManagedProcess.stop) at once leaves dockerd waiting for a containerd already gone.
        if dockerd.pid is not None and dockerd.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(dockerd.pid, signal.SIGTERM)
            deadline = time.monotonic() + _STOP_TIMEOUT_S
            while dockerd.running and time.monotonic() < deadline:
                time.sleep(0.05)
        dockerd.stop()  # reaps it, and sweeps anything left in its group
        assert self.dir is not None
        roots = [self.dir] + ([self.data_root] if self.data_root is not None else [])
        for mount in reversed([m for root in roots for m in _mounts_under(root)]):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)  # normally none
        for cgroup in _cgroups_named(self.cgroup_parent):  # empty once its containers are gone
            for below in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    below.rmdir()
            with contextlib.suppress(OSError):
                cgroup.rmdir()

    @staticmethod
    def leftovers(where: Path) -> Leftovers:
        """Mounts below ``where``, processes naming it, and whether it (or its cgroups) still exist."""
        processes = tuple(pid for pid in _pids_mentioning(str(where)) if pid != os.getpid())
        paths = [str(where)] if where.exists() else []
        paths += [str(cgroup) for cgroup in _cgroups_named(where.name)]
        return Leftovers(tuple(_mounts_under(where)), processes, tuple(paths))

    # ------------------------------------------------------------------ use

    @property
    def socket(self) -> Path:
        if self.dir is None:
            raise RuntimeError("the engine has no socket before start()")
        return self.dir / "docker.sock"

    @property
    def running(self) -> bool:
        if self._attached:
            return self.dir is not None and self.socket.exists() and _ping_quietly(self.socket)
        return self._dockerd is not None and self._dockerd.running

    def env(self) -> dict[str, str]:
        """The environment of a docker CLI call: this engine's socket, BuildKit, a config of its own."""
        assert self.dir is not None, "the engine is not started"
        return {
            "PATH": _ENGINE_PATH,
            "HOME": str(self.dir / "config"),
            "DOCKER_HOST": f"unix://{self.socket}",
            "DOCKER_CONFIG": str(self.dir / "config"),
            "DOCKER_BUILDKIT": "1",
        }

    def docker(
        self,
        *args: str | Path,
        timeout: float = _CLI_TIMEOUT_S,
        stdin: Path | None = None,
        check: bool = True,
    ) -> str:
        """Run ``docker ARGS`` against this engine; its stdout (``DockerCommandError`` on failure)."""
        command = [str(DOCKER_CLI), *map(str, args)]
        with open(stdin, "rb") if stdin is not None else open(os.devnull, "rb") as source:
            result = subprocess.run(
                command, env=self.env(), stdin=source, capture_output=True, timeout=timeout, check=False
            )
        out, err = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
        if check and result.returncode != 0:
            raise DockerCommandError(
                f"{' '.join(command)} exited {result.returncode}:\n{out[-3000:]}{err[-3000:]}"
            )
        return out

    def has_image(self, reference: str) -> bool:
        return bool(self.docker("images", "-q", reference).strip())

    def log_tail(self, lines: int = 40) -> str:
        return self._dockerd.log_tail(lines) if self._dockerd is not None else ""


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` (from /proc/self/mountinfo), outermost first."""
    prefix = str(root.resolve() if root.exists() else root)
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len)


def _cgroups_named(name: str) -> list[Path]:
    """The cgroup ``/<name>`` in every mounted hierarchy (v1: one per controller; v2: one)."""
    if not name:
        return []
    root = Path("/sys/fs/cgroup")
    candidates = [root / name, *(hierarchy / name for hierarchy in root.iterdir() if hierarchy.is_dir())]
    return [path for path in candidates if path.is_dir()]


def _pids_mentioning(text: str) -> list[int]:
    needle = text.encode()
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in Path(entry.path, "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids
