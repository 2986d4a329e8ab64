"""Loopback port reservation that holds across concurrent processes.

Binding port 0 and closing the socket yields a port that is free *now*; between that close and the
moment a child process binds it, another process (an xdist worker, a parallel CI job) can be handed
the same number. As controller-runtime's ``addr`` manager does, every port we hand out is also
claimed by an exclusive ``flock`` on ``<cache>/ports/port-<N>.lock``; a candidate whose lock is held
elsewhere is skipped. The lock is held until ``release()``; if the holder dies, the kernel drops the
lock, so a reservation never outlives its process. Lock files are never deleted (deleting a lock file
while someone may be opening it would let two holders lock two different inodes).

Candidates come from below the kernel's ephemeral port range (``ip_local_port_range``), not from
binding port 0: a port in that range can also be taken, before the child binds it, as the source
port of any outgoing connection on the same address, which no lock can prevent.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Final

from harness.base.binaries import cache_root

LOOPBACK: Final = "127.0.0.1"
_ATTEMPTS: Final = 100
_EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_EPHEMERAL: Final = (32768, 60999)
# Reserved ports are drawn from [_LOWEST_PORT, start of the ephemeral range): above the well-known
# and commonly fixed ports (etcd 2379, the EPP's 9002, ...), below what the kernel uses as source ports.
_LOWEST_PORT: Final = 10000
_MIN_ROOM: Final = 1000
_random = random.SystemRandom()


class PortReservationError(RuntimeError):
    """No free, unclaimed port was found."""


class PortReservation:
    """A claimed loopback port; ``release()`` (or leaving the ``with`` block) gives it back."""

    def __init__(self, port: int, host: str, lock_fd: int) -> None:
        self.port = port
        self.host = host
        self._lock_fd: int | None = lock_fd

    @property
    def held(self) -> bool:
        return self._lock_fd is not None

    def release(self) -> None:
        """Drop the claim (idempotent). Call it once the process using the port is gone."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"PortReservation({self.host}:{self.port}, held={self.held})"


def default_lock_dir() -> Path:
    """The directory shared by every process of this user that reserves ports."""
    return cache_root() / "ports"


def reserve_port(host: str = LOOPBACK, lock_dir: Path | None = None) -> PortReservation:
    """Find a free TCP port on ``host`` and claim it against every other process using ``lock_dir``."""
    directory = lock_dir if lock_dir is not None else default_lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    for _ in range(_ATTEMPTS):
        port = _free_port(host)
        fd = os.open(directory / f"port-{port}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # claimed by someone else (maybe by us, for another component): try again
            continue
        except BaseException:
            os.close(fd)
            raise
        return PortReservation(port, host, fd)
    raise PortReservationError(
        f"no unclaimed free port on {host} after {_ATTEMPTS} attempts (locks in {directory})"
    )


def ephemeral_port_range(path: Path = _EPHEMERAL_RANGE) -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux's default if unreadable)."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return _LINUX_EPHEMERAL
    return low, high


def _free_port(host: str) -> int:
    """A port free on ``host`` now, below the kernel's ephemeral range when there is room for it.

    A port inside that range (what binding port 0 hands out) can be taken between this check and
    the child's bind as the *source* port of any outgoing connection on the same address (a scrape,
    a watch, a probe): no lock file prevents that, and the child then fails with EADDRINUSE (seen in
    CI: an EPP's metrics port). The kernel never picks a source port outside the range.
    """
    low, _ = ephemeral_port_range()
    if low - _LOWEST_PORT >= _MIN_ROOM:
        for _ in range(_ATTEMPTS):
            port = _random.randrange(_LOWEST_PORT, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue  # in use (or in TIME_WAIT): another candidate
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def claim_port(port: int, wait: float = 0.0, lock_dir: Path | None = None) -> PortReservation:
    """Claim a *fixed* port (one a program binds whatever its flags say) against the other holders.

    Uses the same lock files as ``reserve_port``, so a fixed port is never also handed out as a free
    one. Waits up to ``wait`` seconds for another holder to release it, then raises
    ``PortReservationError``; it also raises when something outside the harness is bound to the port
    on any address (the claim could not prevent that collision).
    """
    directory = lock_dir if lock_dir is not None else default_lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"port-{port}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise PortReservationError(
                        f"port {port} is claimed by another process of the harness (lock {path})"
                    ) from None
                time.sleep(0.1)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind(("", port))
        except OSError as exc:
            raise PortReservationError(f"port {port} is in use outside the harness: {exc}") from exc
    except BaseException:
        os.close(fd)
        raise
    return PortReservation(port, "", fd)
