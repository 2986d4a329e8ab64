"""Port reservations: unique while held, visible to other processes, released on demand."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.base import ports
from harness.base.ports import PortReservationError, claim_port, reserve_port


def test_reserved_port_is_free_loopback_port(tmp_path: Path) -> None:
    with reserve_port(lock_dir=tmp_path) as reservation:
        with socket.socket() as sock:
            sock.bind((reservation.host, reservation.port))  # nobody else is listening on it
        assert reservation.host == "127.0.0.1"
        assert reservation.held


def test_reservations_held_together_are_distinct(tmp_path: Path) -> None:
    held = [reserve_port(lock_dir=tmp_path) for _ in range(20)]
    try:
        assert len({r.port for r in held}) == 20
    finally:
        for reservation in held:
            reservation.release()


def test_a_port_claimed_elsewhere_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    candidates: Iterator[int] = iter([40001, 40001, 40002])
    monkeypatch.setattr(ports, "_free_port", lambda host: next(candidates))
    first = reserve_port(lock_dir=tmp_path)
    second = reserve_port(lock_dir=tmp_path)
    try:
        assert (first.port, second.port) == (40001, 40002)
    finally:
        first.release()
        second.release()


def test_claim_is_an_flock_that_release_drops(tmp_path: Path) -> None:
    reservation = reserve_port(lock_dir=tmp_path)
    fd = os.open(tmp_path / f"port-{reservation.port}.lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        reservation.release()
        reservation.release()  # idempotent
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert not reservation.held
    finally:
        os.close(fd)


def test_another_process_cannot_claim_a_held_port(tmp_path: Path) -> None:
    with reserve_port(lock_dir=tmp_path) as reservation:
        probe = (
            "import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "try:\n"
            "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
            "except BlockingIOError:\n"
            "    print('held')\n"
            "else:\n"
            "    print('free')\n"
        )
        lock_file = str(tmp_path / f"port-{reservation.port}.lock")
        result = subprocess.run([sys.executable, "-c", probe, lock_file], capture_output=True, text=True)
        assert result.stdout.strip() == "held"


def test_gives_up_when_every_candidate_is_claimed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_free_port", lambda host: 40003)
    with reserve_port(lock_dir=tmp_path), pytest.raises(PortReservationError, match="no unclaimed free port"):
        reserve_port(lock_dir=tmp_path)


def test_a_fixed_port_is_claimed_once_and_waits_for_its_holder(tmp_path: Path) -> None:
    with reserve_port(lock_dir=tmp_path) as free:
        port = free.port
    first = claim_port(port, lock_dir=tmp_path)
    with pytest.raises(PortReservationError, match="claimed by another process"):
        claim_port(port, lock_dir=tmp_path)
    release = threading.Timer(0.2, first.release)
    release.start()
    second = claim_port(port, wait=10, lock_dir=tmp_path)  # got it once the first let go
    release.join()
    second.release()


def test_a_fixed_port_bound_outside_the_harness_is_an_error(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(PortReservationError, match="in use outside the harness"):
            claim_port(port, lock_dir=tmp_path)


def test_reserved_ports_are_never_ones_the_kernel_hands_out_as_source_ports(tmp_path: Path) -> None:
    """An outgoing connection takes its source port from the ephemeral range; a reserved port there
    could be taken that way before the child binds it (CI saw an EPP fail with EADDRINUSE)."""
    low, high = ports.ephemeral_port_range()
    held = [reserve_port(lock_dir=tmp_path) for _ in range(50)]
    try:
        inside = [r.port for r in held if low <= r.port <= high]
        assert inside == [], f"reserved inside the ephemeral range {low}-{high}: {inside}"
    finally:
        for reservation in held:
            reservation.release()


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    custom = tmp_path / "ip_local_port_range"
    custom.write_text("20000\t29999\n")
    assert ports.ephemeral_port_range(custom) == (20000, 29999)
    assert ports.ephemeral_port_range(tmp_path / "missing") == (32768, 60999)


def test_with_no_room_below_the_ephemeral_range_any_free_port_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "ephemeral_port_range", lambda: (1024, 65535))
    with reserve_port(lock_dir=tmp_path) as reservation, socket.socket() as sock:
        sock.bind((reservation.host, reservation.port))
