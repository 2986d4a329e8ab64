"""ManagedProcess: start races health against early exit and timeout; stop takes the whole group."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.base import guards
from harness.base.eventually import eventually
from harness.base.process import ChildProcesses, ManagedProcess, ProcessStartError, sweep_orphans

IGNORE_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('ready', flush=True)
time.sleep(300)
"""


def _gone(pid: int) -> None:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return
    assert state == "Z", f"process {pid} still running (state {state})"


def test_start_waits_for_health_and_stop_removes_everything() -> None:
    checks: list[int] = []

    def healthy_on_third_check() -> bool:
        checks.append(1)
        return len(checks) >= 3

    process = ManagedProcess("sleeper", "/bin/sleep", ["300"], health_check=healthy_on_third_check)
    process.start()
    assert len(checks) == 3
    pid, directory = process.pid, process.dir
    assert pid is not None
    assert directory is not None
    assert process.running
    assert directory.is_dir()
    process.stop()
    process.stop()  # idempotent
    assert not process.running
    assert not directory.exists()
    _gone(pid)


def test_early_exit_fails_fast_with_the_log_tail() -> None:
    process = ManagedProcess(
        "broken", "/bin/sh", ["-c", "echo 'cannot bind: address in use' >&2; exit 3"],
        health_check=lambda: False, start_timeout=60,
    )  # fmt: skip
    with pytest.raises(ProcessStartError, match=r"exited during start \(exit code 3\)") as info:
        process.start()
    assert "cannot bind: address in use" in info.value.log_tail
    assert process.pid is None


def test_unhealthy_process_times_out_and_is_stopped() -> None:
    process = ManagedProcess("mute", "/bin/sleep", ["300"], health_check=lambda: False, start_timeout=0.3)
    with pytest.raises(ProcessStartError, match=r"mute not healthy after 0.3s"):
        process.start()
    assert process.pid is None


def test_health_check_errors_count_as_not_yet() -> None:
    attempts = []

    def flaky() -> bool:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionRefusedError
        return True

    with ManagedProcess("flaky", "/bin/sleep", ["300"], health_check=flaky) as process:
        assert process.running
    assert len(attempts) == 3


def test_missing_binary_is_a_start_error(tmp_path: Path) -> None:
    with pytest.raises(ProcessStartError, match="cannot execute"):
        ManagedProcess("ghost", tmp_path / "nope", []).start()


def test_sigterm_ignored_means_sigkill_after_stop_timeout() -> None:
    process = ManagedProcess("stubborn", sys.executable, ["-c", IGNORE_SIGTERM], stop_timeout=0.3)
    process.start()
    pid = process.pid
    assert pid is not None
    eventually(lambda: _assert_contains(process.log_tail(), "ready"))
    process.stop()
    _gone(pid)


def test_stop_takes_the_whole_process_group() -> None:
    process = ManagedProcess("parent", "/bin/sh", ["-c", "sleep 300 & sleep 300 & wait"])
    process.start()
    pid = process.pid
    assert pid is not None
    grandchildren = eventually(lambda: _assert_children(pid, 2))
    process.stop()
    for child in grandchildren:  # not our children: they die (and are reaped) asynchronously
        eventually(functools.partial(_gone, child.pid))


def test_log_captures_output(tmp_path: Path) -> None:
    process = ManagedProcess("echo", "/bin/sh", ["-c", "echo line-1; echo line-2; sleep 300"], dir=tmp_path)
    with process:
        eventually(lambda: _assert_contains(process.log_tail(lines=1), "line-2"))
        assert process.log_path == tmp_path / "echo.log"
    assert (tmp_path / "echo.log").read_text() == "line-1\nline-2\n"  # a given dir is kept


def _assert_contains(text: str, needle: str) -> None:
    assert needle in text


def _assert_children(pid: int, count: int) -> list[guards.ChildProcess]:
    children = guards.child_processes(pid)
    assert len(children) == count, children
    return children


def test_sweep_orphans_stops_what_a_dead_owner_left(tmp_path: Path) -> None:
    dead_pid = _exited_pid()
    orphan = tmp_path / f"epp-harness-{dead_pid}-cp-x"
    mine = tmp_path / f"epp-harness-{os.getpid()}-cp-z"
    for directory in (orphan, mine):
        directory.mkdir()
    straggler = subprocess.Popen(  # like an etcd whose harness was SIGKILLed: the dir is in its argv
        [sys.executable, "-c", "import time; time.sleep(300)", f"--data-dir={orphan}/etcd"],
        start_new_session=True,
    )
    try:
        eventually(functools.partial(_assert_argv_mentions, straggler.pid, str(orphan)))  # exec settles
        removed = sweep_orphans(root=str(tmp_path))
        assert removed == [str(orphan)]
        assert straggler.wait(timeout=10) == -9
        assert mine.is_dir()
    finally:
        straggler.kill()
        straggler.wait()


def _assert_argv_mentions(pid: int, text: str) -> None:
    assert text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()


def _exited_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_child_processes_undo_in_reverse_order_even_when_one_step_fails() -> None:
    order: list[str] = []
    children = ChildProcesses()
    directory = children.temp_dir("test")
    port = children.reserve_port()
    children.defer(lambda: order.append("first taken"))
    children.defer(lambda: (_ for _ in ()).throw(RuntimeError("cleanup failed")))
    sleeper = children.start(ManagedProcess("sleeper", "/bin/sleep", ["300"]))
    children.defer(lambda: order.append(f"last taken, sleeper running={sleeper.running}"))
    pid = sleeper.pid
    assert pid is not None
    assert children.dead() == []

    with pytest.raises(RuntimeError, match="cleanup failed"):
        children.close()  # the failure is raised only after everything else was undone

    assert order == ["last taken, sleeper running=True", "first taken"]
    _gone(pid)
    assert not directory.exists()
    with reserve_port_again(port):
        pass
    assert [p.name for p in children.processes] == ["sleeper"], "still listed after close, stopped"
    assert children.dead() == [], "a process stopped on purpose is not dead"


def test_a_process_that_exits_on_its_own_is_reported_dead() -> None:
    with ChildProcesses() as children:
        children.start(ManagedProcess("short", "/bin/sh", ["-c", "sleep 0.3; exit 3"]))  # alive at start
        eventually(lambda: _assert_equal(children.dead(), ["short"]))


def test_a_paused_group_is_resumed_before_it_is_stopped() -> None:
    process = ManagedProcess("sleeper", "/bin/sleep", ["300"], stop_timeout=60)
    process.start()
    try:
        pid = process.pid
        assert pid is not None
        process.pause()
        eventually(lambda: _assert_equal(_state(pid), "T"))
    finally:
        began = time.monotonic()
        process.stop()  # resumed first: SIGTERM ends it at once, not the SIGKILL after 60 s
    assert time.monotonic() - began < 30
    _gone(pid)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _assert_equal(got: object, want: object) -> None:
    assert got == want, got


@contextlib.contextmanager
def reserve_port_again(port: int) -> Iterator[None]:
    """Released: the same port's lock can be taken again."""
    import fcntl

    from harness.base.ports import default_lock_dir

    with open(default_lock_dir() / f"port-{port}.lock", "wb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
