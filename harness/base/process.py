"""One supervised child process, modelled on controller-runtime envtest's ``process.State``.

Why this shape (STYLE habit 12):

* Each child runs in its **own process group** (new session), so ``stop()`` can signal everything the
  binary may have spawned, and a Ctrl-C at the terminal reaches only the harness, which then stops
  its children in order instead of letting them die in random order.
* ``start()`` races three outcomes: the health check passes, the process exits early (a broken
  binary, a port in use: reported at once with the log tail, not after the timeout), or the timeout.
* ``stop()`` sends SIGTERM to the group, waits up to ``stop_timeout``, then SIGKILLs the group. The
  leader is not reaped until the group has been swept, so its pid (the group id) cannot be reused by
  an unrelated process while we still signal it.
* Output goes to ``<dir>/<name>.log`` (never to a pipe nobody drains); ``log_tail()`` feeds errors.
* Whoever starts a process stops and reaps it: there is no way to hand a running child to another
  process (an exiting parent would leave Python's "subprocess ... is still running" warning and an
  unreaped child behind), so a control plane shared by xdist workers is started by the controller.
* ``pause()``/``resume()`` stop and continue the whole group (SIGSTOP/SIGCONT); ``stop()`` resumes a
  paused group first, since a stopped process cannot act on SIGTERM.

``ChildProcesses`` is the owner's side, shared by every part of the harness that runs child
processes (the control plane, Envoy, the EPP process, the benchmark's routers): the processes it
started and what they hold (reserved ports, temp dirs), torn down in reverse order on ``close()``,
also after a start that failed half-way.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.parse
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Final, Self

from harness.base.lifecycle import StartStop
from harness.base.ports import LOOPBACK, reserve_port

TEMP_DIR_PREFIX: Final = "epp-harness-"
"""Prefix of every temp dir the harness creates in ``tempfile.gettempdir()`` (the leak guard checks it)."""

DEFAULT_START_TIMEOUT: Final = 20.0
DEFAULT_STOP_TIMEOUT: Final = 20.0
_POLL_INTERVAL: Final = 0.05
_KILL_WAIT: Final = 5.0

HealthCheck = Callable[[], bool]


def temp_prefix(kind: str) -> str:
    """``mkdtemp`` prefix for harness temp dirs: ``epp-harness-<pid>-<kind>-``.

    The pid lets the leak guard blame only dirs made by its own process, even when xdist workers and
    other runs share the temp directory.
    """
    return f"{TEMP_DIR_PREFIX}{os.getpid()}-{kind}-"


class ProcessStartError(RuntimeError):
    """A managed process did not become healthy; ``log_tail`` holds the end of its output."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(f"{message}\n--- last lines of output ---\n{log_tail}")
        self.log_tail = log_tail


def http_health_check(
    url: str, ssl_context: ssl.SSLContext | None = None, timeout: float = 1.0
) -> HealthCheck:
    """A check that is true when ``GET url`` answers 200 (connection errors count as "not yet")."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query

    def check() -> bool:
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            connection = http.client.HTTPSConnection(parts.netloc, timeout=timeout, context=ssl_context)
        else:
            connection = http.client.HTTPConnection(parts.netloc, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            response.read()
            return response.status == 200
        finally:
            connection.close()

    return check


class ManagedProcess(StartStop):
    """A binary with args, a working dir, a health check, and start/stop timeouts."""

    def __init__(
        self,
        name: str,
        binary: Path | str,
        args: Sequence[str],
        *,
        dir: Path | None = None,
        health_check: HealthCheck | None = None,
        health_url: str | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``dir`` is created (and removed at stop) when not given. A process without any health check
        counts as started as soon as it is spawned."""
        if health_check is not None and health_url is not None:
            raise ValueError("give health_check or health_url, not both")
        self.name = name
        self.binary = Path(binary)
        self.args = list(args)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.env = dict(env) if env is not None else None
        self._health = health_check or (http_health_check(health_url) if health_url else None)
        self._given_dir = dir
        self.dir: Path | None = dir
        self._owns_dir = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._paused = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Spawn the process and wait until healthy; on failure stop it and raise ``ProcessStartError``."""
        self.launch()
        self.wait_until_healthy()
        return self

    def launch(self) -> None:
        """Spawn the process without waiting (``wait_until_healthy`` next), so siblings can start together."""
        if self._proc is not None:
            raise RuntimeError(f"{self.name} already started")
        if self._given_dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix=temp_prefix(self.name)))
            self._owns_dir = True
        assert self.dir is not None
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        try:
            self._proc = subprocess.Popen(
                [str(self.binary), *self.args],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=self.env,
                start_new_session=True,
            )
        except OSError as exc:
            self.stop()
            raise ProcessStartError(f"{self.name}: cannot execute {self.binary}: {exc}", "") from exc
        _register(self)

    def wait_until_healthy(self) -> None:
        """Race the health check against early exit and the start timeout; stop the process on failure."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} is not launched")
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        if self._health is None:
            self._check_alive("start")
            return
        self.wait_for(self._health, "healthy")

    def wait_for(self, check: HealthCheck, what: str, timeout: float | None = None) -> None:
        """Poll ``check`` until it is true; fail at once (with the log tail) if this process exits
        first, or after ``timeout`` (default ``start_timeout``). Exceptions from ``check`` count as
        "not yet" (not listening yet, TLS not ready ...)."""
        limit = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        last_error: BaseException | None = None
        while True:
            self._check_alive(f"waiting until {what}")
            try:
                if check():
                    return
                last_error = None
            except Exception as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                why = f" (last check: {last_error!r})" if last_error else ""
                raise ProcessStartError(
                    f"{self.name} not {what} after {limit:g}s{why}",
                    self.log_tail(),
                )
            time.sleep(_POLL_INTERVAL)

    def _check_alive(self, during: str) -> None:
        if self._proc is None:
            raise RuntimeError(f"{self.name} is not running")
        status = _exit_status(self._proc.pid)
        if status is not None:
            raise ProcessStartError(
                f"{self.name} exited during start ({status}): {self.binary} {' '.join(self.args)}",
                self.log_tail(),
            )

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL after ``stop_timeout``, reap, close the log, remove an owned dir.

        Idempotent, and safe after a failed or partial start.
        """
        proc, self._proc = self._proc, None
        try:
            if proc is not None:
                _unregister(self)
                if self._paused:
                    _killpg(proc.pid, signal.SIGCONT)
                    self._paused = False
                _terminate_group(proc.pid, self.stop_timeout, lambda: _exit_status(proc.pid) is not None)
                proc.wait()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            if self._owns_dir and self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
                self._owns_dir = False

    def kill(self) -> None:
        """A crash, not a shutdown: SIGKILL the group at once, then reap (``stop()`` with no grace)."""
        self.stop_timeout = 0.0
        self.stop()

    def pause(self) -> None:
        """SIGSTOP the group (it keeps its state and sockets; uses no CPU until ``resume()``)."""
        if self._proc is not None and not self._paused:
            _killpg(self._proc.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        if self._proc is not None and self._paused:
            _killpg(self._proc.pid, signal.SIGCONT)
            self._paused = False

    # ------------------------------------------------------------------ introspection

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and _exit_status(self._proc.pid) is None

    @property
    def log_path(self) -> Path:
        if self.dir is None:
            raise RuntimeError(f"{self.name} has no directory before start()")
        return self.dir / f"{self.name}.log"

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the process output ('' if there is none yet)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 64 * 1024))
                text = log.read().decode("utf-8", errors="replace")
        except (OSError, RuntimeError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, dir={self.dir})"


class ChildProcesses:
    """The child processes one owner started, and the resources they hold, undone in reverse order.

    Register each thing when it is taken (``start``/``launch``/``add`` a process, ``reserve_port``,
    ``temp_dir``, or any ``defer``red cleanup); ``close()`` stops and releases everything taken so far,
    last first, whether the owner's start finished or failed half-way, and is idempotent. Errors
    while closing do not stop the rest from being closed; the first one is raised at the end.
    """

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self._processes: list[ManagedProcess] = []

    def add(self, process: ManagedProcess) -> ManagedProcess:
        """Own ``process`` (stopped by ``close()``) without starting it."""
        self._processes.append(process)
        self._undo.append(process.stop)
        return process

    def launch(self, process: ManagedProcess) -> ManagedProcess:
        """Own and spawn it; ``process.wait_until_healthy()`` later (siblings start side by side)."""
        self.add(process).launch()
        return process

    def start(self, process: ManagedProcess) -> ManagedProcess:
        """Own it, spawn it and wait until it is healthy."""
        self.add(process).start()
        return process

    def defer(self, cleanup: Callable[[], None]) -> None:
        self._undo.append(cleanup)

    def reserve_port(self, host: str = LOOPBACK) -> int:
        """A port reserved across processes (``harness.base.ports``), released at ``close()``."""
        reservation = reserve_port(host)
        self.defer(reservation.release)
        return reservation.port

    def temp_dir(self, kind: str) -> Path:
        """A harness temp dir (named for the leak guard), removed at ``close()``."""
        path = Path(tempfile.mkdtemp(prefix=temp_prefix(kind)))
        self.defer(lambda: shutil.rmtree(path, ignore_errors=True))
        return path

    @property
    def processes(self) -> list[ManagedProcess]:
        """Owned processes, in the order they were added (still listed, stopped, after ``close()``)."""
        return list(self._processes)

    def dead(self) -> list[str]:
        """Names of owned processes that were spawned and have exited since."""
        return [p.name for p in self._processes if p.pid is not None and not p.running]

    def log_tails(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- {p.name} log ---\n{p.log_tail(lines) or '(no output)'}" for p in self._processes
        )

    def close(self) -> None:
        first: BaseException | None = None
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except BaseException as exc:  # keep closing the rest; the first error is raised after
                first = first or exc
        if first is not None:
            raise first

    def __enter__(self) -> ChildProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sweep_orphans(root: str | None = None) -> list[str]:
    """Clean up after harness processes that died without cleaning up (SIGKILL, a CI timeout).

    A temp dir named by ``temp_prefix`` whose owner pid is gone is an orphan: any process still
    running with the dir on its command line (an etcd whose harness was killed) is SIGKILLed with its
    group, then the dir is removed. A reused owner pid only makes the sweep skip a dir, never remove a
    live one. Returns the removed dirs.
    ``root`` defaults to ``tempfile.gettempdir()``.
    """
    root = root if root is not None else tempfile.gettempdir()
    pattern = re.compile(rf"^{re.escape(TEMP_DIR_PREFIX)}(\d+)-")
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed = []
    for name in names:
        match = pattern.match(name)
        path = os.path.join(root, name)
        if match is None or _pid_exists(int(match.group(1))):
            continue
        for pid in _processes_mentioning(path):
            _killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _processes_mentioning(text: str) -> list[int]:
    needle = text.encode()
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if needle in Path(entry.path, "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


# ---------------------------------------------------------------------- process-group plumbing


def _terminate_group(pgid: int, timeout: float, exited: Callable[[], bool]) -> None:
    """SIGTERM the group, wait for the leader up to ``timeout``, SIGKILL; finally sweep the group."""
    if not exited():
        _killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while not exited() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not exited():
            _killpg(pgid, signal.SIGKILL)
            deadline = time.monotonic() + _KILL_WAIT
            while not exited() and time.monotonic() < deadline:
                time.sleep(0.02)
    _killpg(pgid, signal.SIGKILL)  # anything the leader left behind in its group


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _exit_status(pid: int) -> str | None:
    """How our child ``pid`` ended, without reaping it (``None`` while it runs)."""
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return "already reaped"
    if result is None:
        return None
    if result.si_code == os.CLD_EXITED:
        return f"exit code {result.si_status}"
    return f"killed by signal {result.si_status}"


# ---------------------------------------------------------------------- last-resort cleanup

_LIVE: weakref.WeakSet[ManagedProcess] = weakref.WeakSet()
_atexit_registered = False


def _register(process: ManagedProcess) -> None:
    """Track a running process so that an interpreter exit without ``stop()`` still kills it."""
    global _atexit_registered
    _LIVE.add(process)
    if not _atexit_registered:
        atexit.register(_stop_all)
        _atexit_registered = True


def _unregister(process: ManagedProcess) -> None:
    _LIVE.discard(process)


def _stop_all() -> None:
    for process in list(_LIVE):
        process.stop_timeout = min(process.stop_timeout, 5.0)
        with contextlib.suppress(Exception):
            process.stop()
