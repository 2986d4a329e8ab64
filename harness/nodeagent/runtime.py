"""The agent's side of the container launcher (``harness.nodeagent.zygote``): start, signal, watch exits.

One ``Launcher`` per agent, on the agent's event loop. It starts the zygote as a child (in the
agent's process group), sends it requests, and resolves each started process's ``exited`` future
when the zygote reports the exit. If the zygote itself dies, every pending and future call fails
with ``LauncherGone``: the agent treats that as fatal (it cannot run containers any more).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

_STOP_TIMEOUT: Final = 5.0


class LauncherGone(RuntimeError):
    """The zygote exited: no container can be started or signalled any more."""


class StartFailed(RuntimeError):
    """The zygote could not start the process (the message is its reason)."""


@dataclass(frozen=True)
class ExitStatus:
    code: int | None  # exit code, or None when killed by a signal
    signal: int | None
    reason: str | None = None  # what a runtime may know beyond the code ("OOMKilled")

    @property
    def container_exit_code(self) -> int:
        """What a container runtime reports: the code, or 128 + the signal."""
        return self.code if self.code is not None else 128 + (self.signal or 0)


@dataclass
class Process:
    """One running container process; ``exited`` resolves when the zygote has reaped it (or, for a
    real container, ``harness.nodeagent.containers``, when the engine reports its exit)."""

    pid: int
    exited: asyncio.Future[ExitStatus] = field(repr=False)
    container_id: str = ""  # the engine's id, for a real container


@dataclass(frozen=True)
class PythonEntry:
    """Run ``entry(argv)`` ("module:function", imported once by the zygote) in a forked child."""

    entry: str
    argv: tuple[str, ...]

    @property
    def module(self) -> str:
        return self.entry.partition(":")[0]


@dataclass(frozen=True)
class Executable:
    """Fork and exec ``argv[0]`` (an absolute path); ``env`` is the image's own environment (its ENV
    lines), under the container's: the pod spec's ``env`` wins, as in a container runtime."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


Command = PythonEntry | Executable


class Launcher:
    def __init__(self, preload: Sequence[str], log_path: Path) -> None:
        self._preload = tuple(preload)
        self._log_path = log_path
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[Mapping[str, Any]]] = {}
        self._running: dict[int, Process] = {}
        self._ready: asyncio.Future[None] | None = None
        self._gone = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        stderr = self._log_path.open("ab")
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "harness.nodeagent.zygote",
                *self._preload,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        finally:
            stderr.close()  # the zygote holds its own copy
        self._reader = asyncio.create_task(self._read(), name="zygote-reader")
        await self._ready

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._process is not None and not self._gone

    async def wait_gone(self) -> None:
        """Returns when the zygote has exited (for the agent's supervisor)."""
        if self._reader is not None:
            await asyncio.shield(self._reader)

    async def run(self, command: Command, *, env: Mapping[str, str], log_file: Path, cwd: Path) -> Process:
        """Start one container process; raises StartFailed (or LauncherGone)."""
        request: dict[str, Any] = {"env": dict(env), "log": str(log_file), "cwd": str(cwd)}
        if isinstance(command, PythonEntry):
            request.update(op="spawn", entry=command.entry, argv=list(command.argv))
        else:
            request.update(op="exec", argv=list(command.argv))
        reply = await self._request(request)
        if "error" in reply:
            raise StartFailed(str(reply["error"]))
        pid = int(reply["pid"])
        process = self._running.get(pid)
        if process is None:  # the usual case: no exit reported before the reply
            process = Process(pid, asyncio.get_running_loop().create_future())
            self._running[pid] = process
        elif process.exited.done():  # it exited before this coroutine resumed
            del self._running[pid]
        return process

    async def signal(self, process: Process, sig: signal.Signals) -> None:
        """Send ``sig`` unless the process has already exited (never a reused pid)."""
        if process.exited.done():
            return
        await self._request({"op": "signal", "pid": process.pid, "signal": int(sig)})

    async def close(self) -> None:
        """Close the zygote's stdin (it kills its children and exits); wait, then kill it if needed."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), _STOP_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._reader is not None:
            await self._reader

    # ---- the channel -----------------------------------------------------------------------------
    async def _request(self, request: dict[str, Any]) -> Mapping[str, Any]:
        process = self._process
        if self._gone or process is None or process.stdin is None:
            raise LauncherGone("the container launcher is not running")
        request_id = next(self._ids)
        reply: asyncio.Future[Mapping[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[request_id] = reply
        try:
            process.stdin.write(json.dumps({**request, "id": request_id}).encode() + b"\n")
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._replies.pop(request_id, None)
            raise LauncherGone("the container launcher exited") from exc
        return await reply

    async def _read(self) -> None:
        assert self._process is not None
        stdout = self._process.stdout
        assert stdout is not None
        try:
            while line := await stdout.readline():
                self._dispatch(json.loads(line))
        finally:
            self._gone = True
            gone = LauncherGone("the container launcher exited")
            for future in self._replies.values():
                if not future.done():
                    future.set_exception(gone)
            self._replies.clear()
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(gone)
            for process in self._running.values():
                if not process.exited.done():
                    process.exited.set_result(ExitStatus(None, int(signal.SIGKILL)))
            self._running.clear()

    def _dispatch(self, message: Mapping[str, Any]) -> None:
        if message.get("ready"):
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
            return
        if "exited" in message:
            pid = int(message["exited"])
            status = ExitStatus(message.get("code"), message.get("signal"))
            process = self._running.pop(pid, None)
            if process is None:  # exited before the spawn reply was read: keep it for run()
                process = Process(pid, asyncio.get_running_loop().create_future())
                process.exited.set_result(status)
                self._running[pid] = process
                return
            if not process.exited.done():
                process.exited.set_result(status)
            return
        future = self._replies.pop(int(message["id"]), None)
        if future is not None and not future.done():
            future.set_result(message)
