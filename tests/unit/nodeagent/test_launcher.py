"""The container launcher: a pre-imported zygote forks container processes; exits are reported,
signals reach only live processes, and closing it leaves none behind."""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path

import pytest

from harness.base.ports import reserve_port
from harness.nodeagent.runtime import Executable, Launcher, LauncherGone, PythonEntry, StartFailed

PAUSE = PythonEntry("harness.nodeagent.images:pause", ())
PRELOAD = ("harness.nodeagent.images", "harness.sim._llmd")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_forked_entry_points_run_report_their_exit_and_take_signals(tmp_path: Path) -> None:
    async def main() -> None:
        launcher = Launcher(PRELOAD, tmp_path / "launcher.log")
        await launcher.start()
        try:
            log = tmp_path / "bad.log"
            bad = await launcher.run(
                PythonEntry("harness.sim._llmd:main", ("--bogus",)), env={}, log_file=log, cwd=tmp_path
            )
            status = await asyncio.wait_for(bad.exited, 10)
            assert (status.code, status.signal) == (1, None)
            assert "unknown flag: --bogus" in log.read_text()

            paused = await launcher.run(PAUSE, env={"X": "1"}, log_file=tmp_path / "p.log", cwd=tmp_path)
            assert alive(paused.pid)
            await launcher.signal(paused, signal.SIGTERM)
            status = await asyncio.wait_for(paused.exited, 10)
            assert (status.code, status.signal) == (0, None), "pause exits 0 on SIGTERM"

            killed = await launcher.run(PAUSE, env={}, log_file=tmp_path / "k.log", cwd=tmp_path)
            await launcher.signal(killed, signal.SIGKILL)
            status = await asyncio.wait_for(killed.exited, 10)
            assert (status.signal, status.container_exit_code) == (signal.SIGKILL, 137)
            await launcher.signal(killed, signal.SIGKILL)  # already reaped: nothing is signalled
        finally:
            await launcher.close()

    asyncio.run(main())


@pytest.mark.skipif(shutil.which("sleep") is None, reason="no sleep binary")
def test_closing_the_launcher_kills_what_it_started(tmp_path: Path) -> None:
    async def main() -> list[int]:
        launcher = Launcher(PRELOAD, tmp_path / "launcher.log")
        await launcher.start()
        sleep = shutil.which("sleep")
        assert sleep is not None
        started = [
            await launcher.run(
                Executable((sleep, "infinity")), env={}, log_file=tmp_path / "s.log", cwd=tmp_path
            ),
            await launcher.run(PAUSE, env={}, log_file=tmp_path / "p.log", cwd=tmp_path),
        ]
        await launcher.close()
        for process in started:
            status = await asyncio.wait_for(process.exited, 10)
            assert status.signal == signal.SIGKILL
        with pytest.raises(LauncherGone):
            await launcher.run(PAUSE, env={}, log_file=tmp_path / "p.log", cwd=tmp_path)
        return [p.pid for p in started]

    pids = asyncio.run(main())
    assert [pid for pid in pids if alive(pid)] == []


def test_an_entry_point_that_cannot_be_imported_is_a_start_failure(tmp_path: Path) -> None:
    async def main() -> None:
        launcher = Launcher(PRELOAD, tmp_path / "launcher.log")
        await launcher.start()
        try:
            missing = PythonEntry("no_such_module:main", ())
            with pytest.raises(StartFailed, match="no_such_module"):
                await launcher.run(missing, env={}, log_file=tmp_path / "x.log", cwd=tmp_path)
        finally:
            await launcher.close()

    asyncio.run(main())


def test_a_simulator_told_to_stop_as_it_starts_exits_cleanly(tmp_path: Path) -> None:
    """The simulator exits 0 on SIGTERM (README: a graceful stop), also when the stop comes before it
    has set up its own signal handling: a liveness probe failing from the start kills a container
    within a few probe periods, and CI saw such a stop reported as 143 instead."""

    async def main() -> list[tuple[int | None, int | None]]:
        launcher = Launcher(("harness.sim._cli",), tmp_path / "launcher.log")
        await launcher.start()
        statuses = []
        try:
            for attempt in range(5):
                with reserve_port() as port:
                    argv = ("--port", str(port.port), "--admin-port", "-1")
                    started = await launcher.run(
                        PythonEntry("harness.sim._cli:main", argv),
                        env={},
                        log_file=tmp_path / f"sim-{attempt}.log",
                        cwd=tmp_path,
                    )
                    await launcher.signal(started, signal.SIGTERM)  # at once: before it serves
                    status = await asyncio.wait_for(started.exited, 10)
                    statuses.append((status.code, status.signal))
        finally:
            await launcher.close()
        return statuses

    assert asyncio.run(main()) == [(0, None)] * 5
