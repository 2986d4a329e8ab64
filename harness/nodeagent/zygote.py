"""The node agent's container launcher: a pre-imported Python process that forks one child per container.

Why: a simulator started as ``python -m harness.sim`` spends 0.2-0.5 s (more on a loaded 2-core box)
importing aiohttp, prometheus_client and the engine before it listens. A cluster test creates
hundreds of pods, and "kubectl apply to routed in 3 s" cannot afford that per replica. This process
imports the container entry points once (``sys.argv[1:]`` names the modules); a fork then costs a few
milliseconds and the child shares the parent's memory pages until it writes them.
``benchmarks/bench_node_agent.py`` measures both ways.

It is single-threaded and never runs an event loop, so forking is safe: the child starts its own
``asyncio.run`` from a clean state. Children stay in the agent's process group (the agent's owner stops
the whole group), and only this process reaps them, so it also delivers signals to them: a pid it has
reaped is never signalled, whatever process reuses the number.

Protocol: one JSON object per line; requests on stdin, replies and events on stdout.

    -> {"op": "spawn", "id": 1, "entry": "harness.sim._cli:main", "argv": [...], "env": {...},
        "log": "/path/to/log", "cwd": "/path"}                 run entry(argv) in a forked child
    -> {"op": "exec", "id": 2, "argv": ["/bin/sleep", "infinity"], "env": {...}, "log": ..., "cwd": ...}
    -> {"op": "signal", "id": 3, "pid": 1234, "signal": 15}
    <- {"ready": true}                                         once the entry modules are imported
    <- {"id": 1, "pid": 1234} | {"id": 1, "error": "..."}      | {"id": 3, "gone": true}
    <- {"exited": 1234, "code": 0} | {"exited": 1234, "signal": 9}

When stdin closes (the agent is gone) every child is killed and this process exits.

Stopping a container at once: SIGTERM is blocked across the fork and unblocked in the child once it
has its disposition, so a SIGTERM sent as soon as the pid is known (a failing liveness probe on a
container still starting) is never taken by a default handler in between. A Python entry that gets
it before it has set up its own handling exits 0, as the simulator does on SIGTERM once serving;
an exec'd program gets it with the default disposition, as a freshly started program would.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import select
import signal
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NoReturn

_MAX_FD: Final = 1024


def _stop_before_start(signum: int, frame: object) -> NoReturn:
    """SIGTERM in a forked Python entry that has not installed its own handler yet: a clean exit."""
    raise SystemExit(0)


def resolve(entry: str) -> Callable[[Sequence[str]], int | None]:
    """``"package.module:function"`` -> the function (imported already when preloaded)."""
    module_name, _, function = entry.partition(":")
    module = importlib.import_module(module_name)
    target: Callable[[Sequence[str]], int | None] = getattr(module, function)
    return target


class Zygote:
    def __init__(self, preload: Sequence[str]) -> None:
        self._entries = {name: importlib.import_module(name) for name in preload}
        self._live: set[int] = set()
        self._buffer = b""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def run(self) -> None:
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self._send({"ready": True, "preloaded": sorted(self._entries)})
        try:
            while True:
                readable, _, _ = select.select([0, self._wake_r], [], [])
                if self._wake_r in readable:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    self._reap()
                if 0 in readable and not self._read_requests():
                    return
        finally:
            self._kill_all()

    # ---- requests ------------------------------------------------------------------------------
    def _read_requests(self) -> bool:
        """Handle every complete request line; False once stdin is closed."""
        chunk = os.read(0, 65536)
        if not chunk:
            return False
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip():
                self._handle(json.loads(line))
        return True

    def _handle(self, request: Mapping[str, Any]) -> None:
        op, request_id = request.get("op"), request.get("id")
        try:
            if op == "signal":
                pid = int(request["pid"])
                if pid not in self._live:
                    self._send({"id": request_id, "gone": True})
                    return
                os.kill(pid, int(request["signal"]))
                self._send({"id": request_id, "ok": True})
                return
            if op not in ("spawn", "exec"):
                raise ValueError(f"unknown op {op!r}")
            pid = self._fork(request)
        except Exception as exc:
            self._send({"id": request_id, "error": f"{type(exc).__name__}: {exc}"})
            return
        self._live.add(pid)
        self._send({"id": request_id, "pid": pid})

    def _fork(self, request: Mapping[str, Any]) -> int:
        argv = [str(a) for a in request["argv"]]
        env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        entry = resolve(str(request["entry"])) if request["op"] == "spawn" else None
        # SIGTERM is held across the fork until the child has its own disposition for it (`_child`):
        # a stop sent the instant the pid is known is neither lost nor taken by the zygote's default.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            os.close(log)
            raise
        if pid:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            os.close(log)
            return pid
        self._child(entry, argv, env, log, str(request.get("cwd") or "/"))  # never returns

    def _child(
        self,
        entry: Callable[[Sequence[str]], int | None] | None,
        argv: list[str],
        env: dict[str, str],
        log: int,
        cwd: str,
    ) -> NoReturn:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            # An exec'd program starts with the default; a Python entry told to stop before it has set
            # up its own handling (the simulator's graceful stop) exits 0, as it would once running.
            signal.signal(signal.SIGTERM, signal.SIG_DFL if entry is None else _stop_before_start)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.closerange(3, _MAX_FD)
            os.chdir(cwd)
            if entry is None:
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as a freshly exec'd program expects
                os.execve(argv[0], argv, env)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = ["container", *argv]
            random.seed()
            result = entry(argv)
            code = result if isinstance(result, int) else 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    # ---- children ------------------------------------------------------------------------------
    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._live.discard(pid)
            if os.WIFSIGNALED(status):
                self._send({"exited": pid, "signal": os.WTERMSIG(status)})
            else:
                self._send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def _kill_all(self) -> None:
        for pid in list(self._live):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _send(self, message: Mapping[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\n"
        with contextlib.suppress(BrokenPipeError):
            while data:
                written = os.write(1, data)
                data = data[written:]


def main() -> None:
    Zygote(sys.argv[1:]).run()


if __name__ == "__main__":
    main()
