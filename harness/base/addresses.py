"""Loopback addresses for simulated pods, unique across concurrent test processes.

Every simulated pod binds its own 127.0.0.x-style address on the same port (like pods sharing a
targetPortNumber), so two xdist workers must never hand out the same address at once. An address is
held by an exclusive flock on a file named after it; the lock dies with the process, so a crashed run
never leaks reservations. 127.0.0.1 is left to ordinary servers; pods use 127.<a>.<b>.<c> above it.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.base.binaries import cache_root

# 127.0.0.2 .. 127.0.254.254: plenty for any test run, never 127.0.0.1.
_FIRST = 2
_LAST = 254 * 256 + 254


def _lock_dir() -> Path:
    """Next to the port reservations, shared by every process of this user."""
    return cache_root() / "addresses"


def lock_path(ip: str) -> Path:
    """The file whose exclusive lock reserves ``ip`` (free when a non-blocking lock succeeds)."""
    return _lock_dir() / ip


def _to_ip(n: int) -> str:
    return f"127.0.{n // 256}.{n % 256}"


@dataclass
class AddressPool:
    """Hands out reserved loopback addresses; `release_all()` (or close) frees them."""

    _held: dict[str, IO[bytes]] = field(default_factory=dict)
    _next: int = field(default_factory=lambda: _FIRST + (os.getpid() * 37) % (_LAST - _FIRST))

    def acquire(self) -> str:
        lock_dir = _lock_dir()
        lock_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(_LAST - _FIRST):
            n = self._next
            self._next = _FIRST if n >= _LAST else n + 1
            if n % 256 in (0, 255):
                continue
            ip = _to_ip(n)
            handle = open(lock_path(ip), "wb")  # noqa: SIM115 - held open as the reservation
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            self._held[ip] = handle
            return ip
        raise RuntimeError("no free loopback address for a simulated pod")

    def release(self, ip: str) -> None:
        handle = self._held.pop(ip, None)
        if handle is not None:
            handle.close()

    def release_all(self) -> None:
        for ip in list(self._held):
            self.release(ip)

    def __enter__(self) -> AddressPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release_all()
