"""A closed-loop load of N connections through nghttp2's ``h2load`` (C, one thread), for throughput runs.

Why not the benchmark's own aiohttp client: on a 2-core machine every process of the path shares the
CPU, and a Python client spends several hundred microseconds of it per request, as much as the EPP
under test or more. Requests per second then say more about the client than about the EPPs; with
``h2load`` the client costs a few tens of microseconds and the path's own processes set the rate.

``h2load --h1 -c N -m 1``: N HTTP/1.1 keep-alive connections, one request in flight on each, the
next sent as the previous completes: N in flight, as the aiohttp workers keep them. Debian's
``nghttp2-client`` provides it; `ensure_h2load` installs it when missing (root and apt-get).
"""

from __future__ import annotations

import asyncio
import re
import resource
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.cluster.container_engine import ensure_packages

H2LOAD = Path("/usr/bin/h2load")
PACKAGE = "nghttp2-client"

_FINISHED = re.compile(r"finished in ([0-9.]+)(m?s)")
_STATUS = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")
_REQUESTS = re.compile(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed")


@dataclass(frozen=True)
class Run:
    """One h2load run: how long it took, what came back, and its own CPU time."""

    seconds: float
    ok: int  # 2xx responses
    failed: int  # everything else: other statuses, errors, timeouts
    client_cpu_s: float


def ensure_h2load() -> Path:
    """The h2load binary, installed from Debian's package when missing."""
    if shutil.which("h2load") is None:
        ensure_packages({H2LOAD: PACKAGE})
    found = shutil.which("h2load")
    if found is None:
        raise RuntimeError(f"h2load not found after installing {PACKAGE}")
    return Path(found)


def parse(output: str) -> tuple[float, int, int]:
    """(seconds, 2xx responses, the other requests) from h2load's summary; ValueError if absent."""
    finished = _FINISHED.search(output)
    status = _STATUS.search(output)
    requests = _REQUESTS.search(output)
    if finished is None or status is None or requests is None:
        raise ValueError(f"not an h2load summary:\n{output[-2000:]}")
    seconds = float(finished.group(1)) / (1000.0 if finished.group(2) == "ms" else 1.0)
    ok = int(status.group(1))
    return seconds, ok, int(requests.group(1)) - ok


async def run(
    binary: Path, url: str, body: bytes, headers: dict[str, str], connections: int, count: int
) -> Run:
    """``count`` POSTs of ``body`` to ``url`` over ``connections`` keep-alive HTTP/1.1 connections."""
    with tempfile.NamedTemporaryFile(prefix="h2load-body-", suffix=".json") as data:
        data.write(body)
        data.flush()
        args = [str(binary), "--h1", "-c", str(connections), "-m", "1", "-n", str(count), "-d", data.name]
        for name, value in headers.items():
            args += ["-H", f"{name}: {value}"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        process = await asyncio.create_subprocess_exec(
            *args, url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output, _ = await process.communicate()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = output.decode("utf-8", "replace")
    if process.returncode != 0:
        raise RuntimeError(f"h2load exited {process.returncode}:\n{text[-2000:]}")
    seconds, ok, failed = parse(text)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(seconds, ok, failed, cpu)
