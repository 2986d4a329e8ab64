"""Leak detection: what a test started and did not stop (STYLE habit 17, after kopf's task guard).

A ``Snapshot`` records the pending asyncio tasks, live threads, running child processes and harness
temp dirs of *this* process. ``find_leaks(before)`` compares a later state against it, polling for a
short grace period so that a thread finishing its last lines or a child handling SIGTERM is not
blamed. Only things that are new are reported, so long-lived resources created earlier (a session
fixture's control plane, the kubernetes client's pool threads, xdist's own threads) are never blamed.

Tasks: asyncio keeps no public registry across event loops, and a sync fixture runs when no loop is
running, so on CPython 3.11-3.13 the module-level registry of all tasks is read (a closed loop's
never-finished tasks are leaks too). Where that registry is absent, only the running loop is seen.
A loop that already had pending tasks at the snapshot and is still running belongs to something older
than the test (a module-scoped simulator serving keep-alive connections from a shared Envoy, say): new
tasks on it are that owner's business and end when it stops its loop, so they are not reported here;
the owner's own teardown is where a guard belongs (``harness.plugin.stack_fixtures.shared_stack`` has one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from harness.base.process import TEMP_DIR_PREFIX

DEFAULT_GRACE: Final = 2.0
_POLL: Final = 0.02


@dataclass(frozen=True)
class ChildProcess:
    """A running child, identified by pid and start time (so a reused pid is a different process)."""

    pid: int
    start_ticks: int
    command: str = field(compare=False)


@dataclass
class Snapshot:
    """What exists at one moment; tasks are held weakly so the snapshot never keeps them alive."""

    tasks: weakref.WeakSet[asyncio.Task[Any]]
    threads: frozenset[threading.Thread]
    children: frozenset[ChildProcess]
    temp_dirs: frozenset[str]
    # Loops with pending tasks at the snapshot: older than the test (see the module docstring).
    loops: weakref.WeakSet[asyncio.AbstractEventLoop] = field(default_factory=weakref.WeakSet)


def snapshot() -> Snapshot:
    tasks = pending_tasks()
    return Snapshot(weakref.WeakSet(tasks), frozenset(live_threads()), frozenset(child_processes()),
                    frozenset(harness_temp_dirs()), weakref.WeakSet(t.get_loop() for t in tasks))  # fmt: skip


def find_leaks(before: Snapshot, grace: float = DEFAULT_GRACE) -> list[str]:
    """Descriptions of everything new since ``before``, after up to ``grace`` seconds of patience."""
    deadline = time.monotonic() + grace
    while True:
        leaks = _describe_new(before)
        if not leaks or time.monotonic() >= deadline:
            return leaks
        time.sleep(_POLL)


def _describe_new(before: Snapshot) -> list[str]:
    leaks = [f"asyncio task {_task_name(t)}" for t in pending_tasks() if _is_new_task(t, before)]
    leaks += [f"thread {t.name!r} (daemon={t.daemon})" for t in live_threads() if t not in before.threads]
    leaks += [f"child process {c.pid}: {c.command}" for c in child_processes() if c not in before.children]
    leaks += [f"temp dir {d}" for d in harness_temp_dirs() if d not in before.temp_dirs]
    return leaks


def _is_new_task(task: asyncio.Task[Any], before: Snapshot) -> bool:
    if task in before.tasks:
        return False
    loop = task.get_loop()
    return not (loop in before.loops and loop.is_running())


def pending_tasks() -> list[asyncio.Task[Any]]:
    """Not-yet-done asyncio tasks of every event loop in this process (see the module docstring)."""
    tasks: set[asyncio.Task[Any]] = set()
    for name in ("_all_tasks", "_scheduled_tasks", "_eager_tasks"):
        registry = getattr(asyncio.tasks, name, None)
        if registry is not None:
            tasks.update(_retry_iteration(registry))
    with contextlib.suppress(RuntimeError):
        tasks.update(asyncio.all_tasks())  # the running loop, if any
    try:
        current = asyncio.current_task()
    except RuntimeError:
        current = None
    return [t for t in tasks if not t.done() and t is not current]


def live_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.is_alive()]


def child_processes(parent: int | None = None) -> list[ChildProcess]:
    """Running (non-zombie) children of ``parent`` (default: this process), read from /proc."""
    ppid = os.getpid() if parent is None else parent
    children = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited while we looked
        command, _, rest = stat.partition("(")[2].rpartition(")")
        fields = rest.split()
        if int(fields[1]) == ppid and fields[0] != "Z":
            children.append(ChildProcess(int(entry.name), int(fields[19]), _cmdline(entry.path) or command))
    return children


def harness_temp_dirs(pid: int | None = None) -> list[str]:
    """Temp dirs named by ``harness.base.process.temp_prefix`` for process ``pid`` (default: this one)."""
    prefix = f"{TEMP_DIR_PREFIX}{os.getpid() if pid is None else pid}-"
    root = tempfile.gettempdir()
    try:
        return sorted(os.path.join(root, n) for n in os.listdir(root) if n.startswith(prefix))
    except OSError:
        return []


def _cmdline(proc_dir: str) -> str:
    try:
        raw = Path(proc_dir, "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]


def _task_name(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    qualname = getattr(coro, "__qualname__", repr(coro))
    return f"{task.get_name()!r} running {qualname}"


def _retry_iteration(registry: Iterable[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    """Copy a weak registry that another thread's loop may change while we iterate."""
    for _ in range(10):
        try:
            return list(registry)
        except RuntimeError:  # "set changed size during iteration"
            continue
    return []


def clean_up_leaks(before: Snapshot) -> None:
    """After reporting: SIGKILL new children and remove new temp dirs, so one leak does not burden
    the rest of the run (threads and tasks cannot be stopped from outside)."""
    for child in child_processes():
        if child not in before.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
    for directory in harness_temp_dirs():
        if directory not in before.temp_dirs:
            shutil.rmtree(directory, ignore_errors=True)
