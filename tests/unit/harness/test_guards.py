"""The leak guard really fails tests that leave tasks, threads, processes or temp dirs behind, and
blames a socket left unclosed on the cluster test that left it.

The leaking tests run in an inner pytest subprocess, so what they leak dies with that process.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest

from harness.base import guards

LEAKY_TESTS = """
import asyncio, socket, subprocess, tempfile, threading, time
import pytest
from harness.base.process import temp_prefix

stop = threading.Event()

def test_clean():
    pass

def test_leaks_thread():
    threading.Thread(target=stop.wait, name="leaky-thread", daemon=True).start()

def test_leaks_task():
    loop = asyncio.new_event_loop()
    async def forever():
        await asyncio.sleep(3600)
    loop.create_task(forever(), name="leaky-task")
    test_leaks_task.loop = loop  # keep it alive and never close it

def test_leaks_process():
    test_leaks_process.process = subprocess.Popen(["sleep", "300"])  # kept: collected, it would warn later

def test_leaks_temp_dir():
    tempfile.mkdtemp(prefix=temp_prefix("leak"))

def test_thread_ending_shortly_after_is_not_a_leak():
    threading.Thread(target=time.sleep, args=(0.2,), daemon=True).start()

def test_cleaned_up_process_is_not_a_leak():
    process = subprocess.Popen(["sleep", "300"])
    process.kill()
    process.wait()

@pytest.fixture
def control_plane():  # stands in for the plugin's: a test on the cluster has its garbage collected
    return None

def test_leaks_a_socket_only_the_collector_finds(control_plane):
    cycle = [socket.socket()]
    cycle.append(cycle)  # unreachable once the test returns, freed by no reference count

@pytest.mark.harness_allow_leaks
def test_opted_out():
    threading.Thread(target=stop.wait, name="allowed-thread", daemon=True).start()
"""


@dataclass(frozen=True)
class LeakyRun:
    output: str
    summary: str


@pytest.fixture(scope="module")
def leaky_run(tmp_path_factory: pytest.TempPathFactory) -> LeakyRun:
    """One inner pytest run of LEAKY_TESTS, in a subprocess, shared by the cases below."""
    directory = tmp_path_factory.mktemp("leaky")
    (directory / "test_leaky.py").write_text(LEAKY_TESTS)
    result = subprocess.run(
        # -W error: as this project's own configuration (an unclosed socket is an error)
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rN", "-W", "error", "test_leaky.py"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return LeakyRun(result.stdout, result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("test_name", "leak"),
    [
        pytest.param("test_leaks_thread", "thread 'leaky-thread'", id="thread"),
        pytest.param("test_leaks_task", "asyncio task 'leaky-task'", id="asyncio-task"),
        pytest.param("test_leaks_process", "child process", id="child-process"),
        pytest.param("test_leaks_temp_dir", "temp dir", id="temp-dir"),
    ],
)
def test_guard_fails_leaking_test(leaky_run: LeakyRun, test_name: str, leak: str) -> None:
    section = leaky_run.output.split(f"ERROR at teardown of {test_name}", 1)
    assert len(section) == 2, leaky_run.output
    report = section[1].split("\n", 1)[1].split("____", 1)[0]
    assert "test left behind" in report
    assert leak in report


def test_a_socket_left_for_the_collector_fails_the_cluster_test_that_left_it(leaky_run: LeakyRun) -> None:
    section = leaky_run.output.split("ERROR at teardown of test_leaks_a_socket_only_the_collector_finds", 1)
    assert len(section) == 2, leaky_run.output
    report = section[1].split("\n", 1)[1].split("____", 1)[0]
    assert "unclosed <socket.socket" in report, report


def test_guard_passes_clean_tests(leaky_run: LeakyRun) -> None:
    # every call passes; exactly the five leaking tests fail, at teardown
    assert "9 passed, 5 errors" in leaky_run.summary, leaky_run.output
    for name in ("test_clean", "test_thread_ending", "test_cleaned_up_process", "test_opted_out"):
        assert f"ERROR at teardown of {name}" not in leaky_run.output


def test_snapshot_ignores_what_existed_before() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        before = guards.snapshot()
        assert guards.find_leaks(before, grace=0) == []
    finally:
        stop.set()
        thread.join()


def test_find_leaks_reports_new_thread_until_it_ends() -> None:
    before = guards.snapshot()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="short-lived", daemon=True)
    thread.start()
    try:
        assert guards.find_leaks(before, grace=0) == ["thread 'short-lived' (daemon=True)"]
    finally:
        stop.set()
        thread.join()
    assert guards.find_leaks(before, grace=0) == []
