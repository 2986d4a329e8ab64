"""`BodyScanner`: big bodies go to one child process, with the same answers as a scan in place.

The child is a real `python -m epp.body.worker` (or a stand-in command for the failure cases), owned
by the scanner: started on first need, replaced when it fails, stopped by `aclose()`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from epp.body import BodyScanner, scan_body
from epp.errors import BadRequest, Internal
from harness.base.eventually import eventually_async

SMALL_LIMIT = 1024
BIG = json.dumps({"prompt": "é" * 2000, "model": "m"}, ensure_ascii=False).encode()


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(BIG, id="utf8"),
        pytest.param(BIG.decode().encode("utf-16"), id="utf16-transcoded"),
        pytest.param(b'{"model": 1, "x": "' + b"y" * 2000 + b'"}', id="refused"),
    ],
)
def test_the_child_answers_as_a_scan_in_place(raw: bytes) -> None:
    async def main() -> None:
        scanner = BodyScanner(offload_bytes=SMALL_LIMIT)
        try:
            try:
                expected: object = scan_body(raw)
            except BadRequest as err:
                expected = err.message
            try:
                got: object = await scanner.scan(raw)
            except BadRequest as err:
                got = err.message
            assert got == expected
            assert scanner.child_pid is not None
        finally:
            await scanner.aclose()
        assert scanner.child_pid is None

    asyncio.run(main())


def test_small_bodies_never_start_a_child() -> None:
    async def main() -> None:
        scanner = BodyScanner(offload_bytes=SMALL_LIMIT)
        assert (await scanner.scan(b'{"model": "m"}')).model == "m"
        assert scanner.child_pid is None
        await scanner.aclose()

    asyncio.run(main())


# Dies on its first body unless the marker exists (and leaves the marker), then serves normally.
CRASH_ONCE = """
import os, sys
marker = sys.argv[1]
if not os.path.exists(marker):
    open(marker, "w").close()
    sys.stdin.buffer.read(4)
    sys.exit(3)
from epp.body.worker import serve
serve(sys.stdin.buffer, sys.stdout.buffer)
"""


def test_a_child_that_dies_fails_one_request_and_is_replaced(tmp_path: Path) -> None:
    async def main() -> None:
        command = [sys.executable, "-c", CRASH_ONCE, str(tmp_path / "crashed")]
        scanner = BodyScanner(offload_bytes=SMALL_LIMIT, command=command)
        try:
            with pytest.raises(Internal, match="request body parser failed"):
                await scanner.scan(BIG)
            assert scanner.child_pid is None
            assert (await scanner.scan(BIG)).model == "m"
        finally:
            await scanner.aclose()

    asyncio.run(main())


def gated_worker(gate: Path) -> list[str]:
    """A real worker that reads a body, then answers only once ``gate`` exists: a scan held in flight."""
    code = f"""
import os, sys, time
from epp.body.worker import serve
while not os.path.exists({str(gate)!r}):
    time.sleep(0.01)
serve(sys.stdin.buffer, sys.stdout.buffer)
"""
    return [sys.executable, "-c", code]


def test_a_cancelled_scan_kills_the_child_and_the_next_one_starts_fresh(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def main() -> None:
        scanner = BodyScanner(offload_bytes=SMALL_LIMIT, command=gated_worker(gate))
        try:
            scan = asyncio.create_task(scanner.scan(BIG))

            async def in_the_child() -> None:
                assert scanner.child_pid is not None

            await eventually_async(in_the_child)
            first = scanner.child_pid
            scan.cancel()
            with pytest.raises(asyncio.CancelledError):
                await scan
            assert scanner.child_pid is None  # out of step with its pipe: killed
            gate.touch()
            assert (await scanner.scan(BIG)).model == "m"
            assert scanner.child_pid not in (None, first)
        finally:
            await scanner.aclose()

    asyncio.run(main())


def test_after_aclose_a_big_body_is_refused_and_no_child_starts() -> None:
    async def main() -> None:
        scanner = BodyScanner(offload_bytes=SMALL_LIMIT)
        await scanner.aclose()
        with pytest.raises(Internal, match="shutting down"):
            await scanner.scan(BIG)
        assert scanner.child_pid is None

    asyncio.run(main())


def test_a_big_body_held_in_the_child_never_holds_up_small_bodies_or_the_loop(tmp_path: Path) -> None:
    """The guarantee behind the offload: an 8 MiB body decoded on the loop stalled every stream and
    probe for ~640 ms. With the big body parked in the child, small ones and other tasks go on."""
    gate = tmp_path / "gate"

    async def main() -> None:
        scanner = BodyScanner(offload_bytes=SMALL_LIMIT, command=gated_worker(gate))
        try:
            big = asyncio.create_task(scanner.scan(BIG))

            async def in_the_child() -> None:
                assert scanner.child_pid is not None, "the big body was not sent to the child"

            await eventually_async(in_the_child)
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                for _ in range(20):
                    await asyncio.sleep(0.001)
                    ticks += 1

            await asyncio.wait_for(tick(), timeout=10)
            for _ in range(50):
                small = await asyncio.wait_for(scanner.scan(b'{"model": "small"}'), timeout=10)
                assert small.model == "small"
            assert ticks == 20
            assert not big.done(), "the big body was answered without its child"
            gate.touch()
            assert (await asyncio.wait_for(big, timeout=30)).model == "m"
        finally:
            gate.touch()  # a failed check must not leave aclose() waiting on a gated child
            await scanner.aclose()

    asyncio.run(main())
