"""EPP resident memory with many pods (target: steady RSS <= 200 MB at 1,000 pods).

A private control plane (etcd + kube-apiserver), one InferencePool (port 8000, selector app=bench),
and the real EPP as its own process (`python -m epp`, as a Deployment runs it). The pods' model
servers are ONE child process: a raw asyncio HTTP server listening on N reserved loopback addresses
(127.0.x.y:8000), answering GET /metrics with a realistic ~44 KB vLLM page (the waiting gauge varies
between answers). Its CPU is not the EPP's, and it counts the pages it serves.

Steps: baseline RSS of the EPP with the pool and 0 pods; N pods created through the API and made
Ready at their addresses by the forged kubelet (a few threads: one page server, no agent pods); wait
until /debug/datastore shows N pods, all with metrics; then sample the EPP for a window (default
10 s). Prints baseline, peak and steady RSS (VmRSS from /proc), the EPP's CPU over the window
(utime+stime), the scrape rate the server saw and the per-pod refresh period it implies, and the
metricsAgeSeconds spread. Asserts nothing.

At the default 50 ms refresh, 1,000 pods ask for 20,000 scrapes/s, far more than one core can do: the
figures then show the effective refresh period, not 50 ms. Run it at 1 s as well for the nominal case.

    .venv/bin/python benchmarks/bench_epp_memory.py [--pods 1000] [--refresh-interval 50ms] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kubernetes import client
from vllm_page import vllm_metrics_page

from epp.config import DEFAULT_REFRESH_METRICS_INTERVAL
from epp.server.flag_values import parse_go_duration
from harness.base.addresses import AddressPool
from harness.cluster.builders import PodBuilder, PoolBuilder
from harness.cluster.controlplane import ControlPlane
from harness.cluster.forged import ForgedKubelet
from harness.cluster.kube import Kube
from harness.cluster.namespaces import create_namespace
from harness.subject.epp_process import EppProcess

NAMESPACE: Final = "bench-memory"
POOL: Final = "bench-pool"
PORT: Final = 8000
LABELS: Final = {"app": "bench"}
TARGET_MB: Final = 200
MIB: Final = 1024 * 1024
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
CREATE_WORKERS: Final = 8  # below the API client's connection pool (cpu_count * 5)
PAGE_VARIANTS: Final = 8  # waiting gauge 0..7, rotated per answer
SERVER_REPLY_TIMEOUT: Final = 30.0


# --- the model servers: one child process, N loopback addresses --------------------------------------
class _ServeStats:
    def __init__(self) -> None:
        self.requests = 0


_NOT_FOUND: Final = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class _MetricsProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server: GET /metrics -> one of the prebuilt answers."""

    def __init__(self, answers: list[bytes], stats: _ServeStats) -> None:
        self._answers = answers
        self._stats = stats
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        assert transport is not None
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            head, self._buffer = self._buffer[:end], self._buffer[end + 4 :]
            request_line = head.split(b"\r\n", 1)[0].split()
            if request_line[:2] == [b"GET", b"/metrics"]:
                self._stats.requests += 1
                transport.write(self._answers[self._stats.requests % len(self._answers)])
            else:
                transport.write(_NOT_FOUND)
            if b"connection: close" in head.lower():
                transport.close()
                return
        if len(self._buffer) > 65536:  # no request head is this long
            transport.close()


def _answer(body: bytes) -> bytes:
    head = (
        "HTTP/1.1 200 OK\r\n"
        "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _serve(addresses: list[str], port: int) -> None:
    """Listen on every address; answer `count` lines on stdin with the pages served; stop at EOF."""
    loop = asyncio.get_running_loop()
    answers = [_answer(vllm_metrics_page(waiting=w).encode()) for w in range(PAGE_VARIANTS)]
    stats = _ServeStats()
    servers: list[asyncio.Server] = []
    try:
        for ip in addresses:
            server = await loop.create_server(
                lambda: _MetricsProtocol(answers, stats), ip, port, reuse_address=True, backlog=64
            )
            servers.append(server)
        page = len(answers[0])
        print(json.dumps({"listening": len(servers), "pageBytes": page}), flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip() == "count":
                print(json.dumps({"requests": stats.requests}), flush=True)
    finally:
        for server in servers:
            server.close()


def serve_main(addresses_file: Path, port: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us (stdin EOF, then SIGKILL)
    addresses = [a for a in addresses_file.read_text().split() if a]
    if not all(a.startswith("127.") for a in addresses):
        raise SystemExit("refusing to bind outside 127.0.0.0/8")
    asyncio.run(_serve(addresses, port))


class ServerChild:
    """The parent's handle on the server process; `close()` ends it (stdin EOF, then SIGKILL)."""

    def __init__(self, addresses: list[str], port: int, workdir: Path) -> None:
        listing = workdir / "addresses.txt"
        listing.write_text("\n".join(addresses) + "\n")
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-from", str(listing), "--serve-port", str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.pid = self._proc.pid
        try:
            hello = self._reply()
        except BaseException:
            self.close()
            raise
        self.page_bytes = int(hello["pageBytes"])
        if int(hello["listening"]) != len(addresses):
            self.close()
            raise RuntimeError(f"server listens on {hello['listening']} of {len(addresses)} addresses")

    def requests(self) -> int:
        stdin = self._proc.stdin
        assert stdin is not None
        stdin.write("count\n")
        stdin.flush()
        return int(self._reply()["requests"])

    def _reply(self) -> dict[str, Any]:
        stdout = cast(IO[str], self._proc.stdout)
        ready, _, _ = select.select([stdout], [], [], SERVER_REPLY_TIMEOUT)
        line = stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"metrics server did not answer (exit status {self._proc.poll()})")
        reply = json.loads(line)
        assert isinstance(reply, dict)
        return reply

    def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


# --- /proc readings ----------------------------------------------------------------------------------
def status_kib(pid: int, field: str) -> int:
    """A `kB` line of /proc/<pid>/status (VmRSS, VmHWM, RssAnon, ...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_count(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class RssSampler:
    """A thread reading VmRSS every `period` seconds until `stop()`, so no peak goes unseen."""

    def __init__(self, pid: int, period: float = 0.1) -> None:
        self._pid = pid
        self._period = period
        self.samples: list[tuple[float, int]] = []  # (monotonic, bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), status_kib(self._pid, "VmRSS") * 1024))
            except (OSError, KeyError):
                return  # the process is gone
            self._stop.wait(self._period)

    def between(self, start: float, end: float) -> list[int]:
        return [rss for t, rss in list(self.samples) if start <= t <= end]

    def peak(self) -> int:
        return max(rss for _, rss in list(self.samples))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# --- the EPP's view ----------------------------------------------------------------------------------
def datastore_view(epp: EppProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{epp.debug_url}/debug/datastore", timeout=30) as resp:
        view = json.loads(resp.read())
    assert isinstance(view, dict)
    return view


def metric_ages(view: dict[str, Any]) -> tuple[int, list[float]]:
    """(pods in the view, the metricsAgeSeconds of those that have metrics)."""
    pods = view["pods"]
    return len(pods), [float(p["metricsAgeSeconds"]) for p in pods if p["metricsAgeSeconds"] is not None]


def wait_all_scraped(epp: EppProcess, pods: int, timeout: float) -> float:
    """Poll /debug/datastore until `pods` pods all have metrics; the time it took."""
    start = time.monotonic()
    deadline = start + timeout
    seen, scraped = 0, 0
    while time.monotonic() < deadline:
        seen, ages = metric_ages(datastore_view(epp))
        scraped = len(ages)
        if seen == pods and scraped == pods:
            return time.monotonic() - start
        time.sleep(0.5)
    raise TimeoutError(f"after {timeout:g}s the datastore holds {seen} pods, {scraped} with metrics")


# --- pods through the API ----------------------------------------------------------------------------
def create_ready_pods(api: client.ApiClient, addresses: list[str]) -> float:
    """Create one pod per address and report it Ready there (forged status); the seconds it took."""
    kubelet = ForgedKubelet(api)

    def one(index: int, ip: str) -> None:
        kubelet.start(NAMESPACE, PodBuilder(f"bench-{index:04d}").labels(LABELS).build(), ip)

    start = time.monotonic()
    executor = ThreadPoolExecutor(CREATE_WORKERS, thread_name_prefix="create-pod")
    try:
        futures = [executor.submit(one, i, ip) for i, ip in enumerate(addresses)]
        for future in futures:
            future.result()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    return time.monotonic() - start


# --- the run -----------------------------------------------------------------------------------------
def mib(value: float) -> str:
    return f"{value / MIB:6.1f} MiB"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def measure(
    args: argparse.Namespace,
    api: client.ApiClient,
    epp: EppProcess,
    server: ServerChild,
    addresses: list[str],
) -> None:
    pid = epp.pid
    assert pid is not None
    sampler = RssSampler(pid)
    try:
        time.sleep(2.0)  # settle: informers synced, nothing to scrape
        now = time.monotonic()
        baseline = statistics.median(sampler.between(now - 1.0, now))
        baseline_cpu = cpu_seconds(pid)

        created_in = create_ready_pods(api, addresses)
        rss_after_create = status_kib(pid, "VmRSS") * 1024
        scraped_in = wait_all_scraped(epp, len(addresses), args.timeout)
        ramp_cpu = cpu_seconds(pid) - baseline_cpu

        # The window: RSS sampled throughout, CPU and pages served at both ends, 4 datastore polls.
        polls = 4
        ages: list[float] = []
        t0, cpu0, srv0, req0 = time.monotonic(), cpu_seconds(pid), cpu_seconds(server.pid), server.requests()
        for k in range(polls):
            time.sleep(max(0.0, t0 + (k + 0.5) * args.seconds / polls - time.monotonic()))
            ages += metric_ages(datastore_view(epp))[1]
        time.sleep(max(0.0, t0 + args.seconds - time.monotonic()))
        t1, cpu1, srv1, req1 = time.monotonic(), cpu_seconds(pid), cpu_seconds(server.pid), server.requests()
        window = sampler.between(t0, t1)
        hwm = status_kib(pid, "VmHWM") * 1024
        anon = status_kib(pid, "RssAnon") * 1024
        fds, threads = open_fds(pid), thread_count(pid)
    finally:
        sampler.stop()

    n = len(addresses)
    wall = t1 - t0
    rate = (req1 - req0) / wall
    interval = parse_go_duration(args.refresh_interval)
    steady = statistics.median(window)
    print(f"EPP memory: {n} pods, --refreshMetricsInterval={args.refresh_interval}, window {wall:.1f} s")
    print(
        f"  metrics page          : {server.page_bytes / 1024:.1f} KiB vLLM text, one server process, "
        f"{n} addresses on :{PORT}"
    )
    print(
        f"  pods created + Ready  : {n} in {created_in:.1f} s ({n / created_in:.0f}/s; "
        f"{CREATE_WORKERS} threads, create + get + status patch each)"
    )
    print(
        f"  all pods scraped      : {scraped_in:.1f} s after the last pod was Ready "
        f"(EPP CPU from first pod to all scraped: {ramp_cpu:.1f} s)"
    )
    print(f"  RSS baseline          : {mib(baseline)} (pool, 0 pods)")
    print(f"  RSS after pods Ready  : {mib(rss_after_create)}")
    print(f"  RSS peak              : {mib(sampler.peak())} sampled every 0.1 s; VmHWM {mib(hwm)}")
    print(
        f"  RSS steady            : {mib(steady)} median over the window "
        f"(min {mib(min(window)).strip()}, max {mib(max(window)).strip()}; anon {mib(anon).strip()})"
    )
    print(f"  RSS per pod           : {(steady - baseline) / n / 1024:.1f} KiB above baseline")
    print(
        f"  EPP CPU               : {cpu1 - cpu0:.2f} s over {wall:.1f} s = "
        f"{(cpu1 - cpu0) / wall * 100:.0f}% of one core; {threads} threads, {fds} open fds"
    )
    print(f"  server CPU            : {(srv1 - srv0) / wall * 100:.0f}% of one core")
    print(
        f"  scrapes served        : {rate:,.0f}/s (nominal {n / interval:,.0f}/s) -> one per pod "
        f"every {n / rate if rate else float('inf'):.3f} s; "
        f"{(cpu1 - cpu0) / max(req1 - req0, 1) * 1e6:.0f} µs EPP CPU per scrape"
    )
    if ages:
        print(
            f"  metricsAgeSeconds     : mean {statistics.fmean(ages):.3f}  p50 {percentile(ages, 50):.3f}  "
            f"p99 {percentile(ages, 99):.3f}  max {max(ages):.3f} s ({polls} polls x {n} pods) "
            f"-> effective refresh ~ 2 x mean = {2 * statistics.fmean(ages):.3f} s"
        )
    verdict = "within" if steady <= TARGET_MB * 1e6 else "OVER"
    print(
        f"  target                : steady RSS <= {TARGET_MB} MB ({TARGET_MB * 1e6 / MIB:.1f} MiB): {verdict}"
    )


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * args.pods + 1024  # sockets here (address locks), in the server and in the EPP
    if soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    signal.signal(signal.SIGTERM, _raise_interrupt)  # clean up on SIGTERM too, as on Ctrl-C

    reserved = AddressPool()
    try:
        addresses = [reserved.acquire() for _ in range(args.pods)]
        with (
            tempfile.TemporaryDirectory(prefix="bench-epp-memory-") as workdir,
            ControlPlane() as plane,
            plane.api_client() as api,
        ):
            create_namespace(api, NAMESPACE)
            pool = PoolBuilder(POOL).namespace(NAMESPACE).selector(LABELS).port(PORT).extension_ref("epp")
            Kube(api).pools.create(NAMESPACE, pool.build())
            server = ServerChild(addresses, PORT, Path(workdir))
            try:
                epp = EppProcess(
                    POOL,
                    NAMESPACE,
                    plane.kubeconfig_path,
                    extra_args=[f"--refreshMetricsInterval={args.refresh_interval}"],
                )
                try:
                    epp.start()
                    epp.wait_serving()
                    measure(args, api, epp, server, addresses)
                finally:
                    epp.close()
            finally:
                server.close()
    finally:
        reserved.release_all()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_interval = f"{round(DEFAULT_REFRESH_METRICS_INTERVAL * 1000)}ms"
    parser.add_argument("--pods", type=int, default=1000, help="pods in the pool (default 1000)")
    parser.add_argument(
        "--refresh-interval",
        default=default_interval,
        help=f"the EPP's --refreshMetricsInterval, a Go duration (default {default_interval})",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling window (default 10)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="wait for every pod's first scrape (default 300 s)"
    )
    parser.add_argument("--serve-from", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--serve-port", type=int, default=PORT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_from is not None:
        serve_main(args.serve_from, args.serve_port)
        return
    parse_go_duration(args.refresh_interval)  # fail here on a bad duration, not in the EPP
    run(args)


if __name__ == "__main__":
    main()
