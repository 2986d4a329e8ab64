"""What HTTP/2 attacks cost the EPP's ext_proc server: RSS growth, CPU, and a normal request's latency.

Three processes: the server (`epp.h2.GrpcServer` over TLS with the EPP's limits and the real
`ExtProcServicer`, plus a method whose handler waits on "wait" messages), the attacker (one attack
of `harness/stress/h2_attacks.py` at a time, over one connection or, for the connection-count attacks,
many), and this driver, which meanwhile sends real ext_proc requests (3 messages each, one after
another, on its own connection) and samples the server's RSS. Loopback only, every attack bounded
in frames and seconds. Targets (issue 21): RSS growth ≤ 8 MiB per attacking connection, a normal
request's added p99 latency ≤ 50 ms. "+CPU s" is the server's CPU time during the attack less what
the probe alone costs (measured before the attacks). Prints, never asserts.

    .venv/bin/python benchmarks/bench_h2_attacks.py [--only rapid-reset,hpack-bomb] [--seconds 10]

`--timeouts S` sets the preface and header timeouts (default 2 s, so the slow attacks end sooner
than with the EPP's 10 s; RSS and CPU do not depend on it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # harness.stress.h2_attacks

import bench_ext_proc  # noqa: E402  (beside this file)

from epp.config import DEFAULT_MAX_REQUEST_BODY_BYTES, GRPC_MESSAGE_HEADROOM  # noqa: E402
from epp.h2 import GrpcServer, Limits  # noqa: E402
from epp.server.tls import KeyPair, self_signed, ssl_context  # noqa: E402
from harness.stress.h2_attacks import ATTACKS, HOLD_PATH, Outcome, Target  # noqa: E402

# How many connections each attack uses (the rest: one).
CONNECTIONS = {"idle-connection": 200, "slowloris-mid-header": 50}
PROBE_BASELINE = 300


# --- the server process ------------------------------------------------------------------------
class _Hold:
    """Echoes each message; one starting with "wait" waits until the stream goes away."""

    def __init__(self, forever: asyncio.Future[None]) -> None:
        self._forever = forever

    async def handle(self, message: bytes) -> tuple[bytes | None, bool]:
        if message.startswith(b"wait"):
            await asyncio.shield(self._forever)
        return b"re:" + message, False

    def close(self) -> None:
        pass


async def serve(cert_dir: Path, timeouts: float) -> None:
    logging.getLogger("epp.h2").setLevel(logging.ERROR)  # one warning per refused connection otherwise
    pair = KeyPair(key_pem=(cert_dir / "tls.key").read_bytes(), cert_pem=(cert_dir / "tls.crt").read_bytes())
    limits = Limits(
        max_message_bytes=DEFAULT_MAX_REQUEST_BODY_BYTES + GRPC_MESSAGE_HEADROOM,
        preface_timeout=timeouts,
        header_timeout=timeouts,
    )
    server = GrpcServer(limits=limits, ssl_context=ssl_context(pair))
    bench_ext_proc_servicer().add_to_h2_server(server)
    forever: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    server.add_method(HOLD_PATH, lambda: _Hold(forever))
    port = await server.start("127.0.0.1", 0)
    print(port, flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(None)
    forever.cancel()


def bench_ext_proc_servicer() -> Any:
    """The servicer of bench_ext_proc.py (10 pods, fresh metrics, two models)."""
    import random

    from prometheus_client import CollectorRegistry

    from epp.config import SchedulerConfig
    from epp.handlers import ExtProcServicer
    from epp.metrics import RequestMetrics
    from epp.scheduling import Scheduler

    frozen = time.monotonic()
    rng = random.Random(2)
    return ExtProcServicer(
        bench_ext_proc._seeded_store(frozen),
        Scheduler(SchedulerConfig(), rng, lambda: frozen),
        RequestMetrics(CollectorRegistry()),
        destination_header_key="x-gateway-destination-endpoint",
        metadata_namespace="envoy.lb",
        rng=rng,
        clock=lambda: frozen,
    )


# --- the attacker process ----------------------------------------------------------------------
async def attack(name: str, port: int, ca: bytes, seconds: float) -> None:
    tls = ssl.create_default_context(cadata=ca.decode())
    tls.set_alpn_protocols(["h2"])
    count = CONNECTIONS.get(name, 1)
    results = await asyncio.gather(
        *(ATTACKS[name](Target("127.0.0.1", port, tls, HOLD_PATH, b"wait"), seconds) for _ in range(count)),
        return_exceptions=True,
    )
    outcomes = [r for r in results if isinstance(r, Outcome)]
    errors = [repr(r) for r in results if not isinstance(r, Outcome)]
    print(
        json.dumps(
            {
                "connections": count,
                "outcomes": sorted(
                    {str(dataclasses.replace(o, seconds=0.0)).rpartition(" in ")[0] for o in outcomes}
                ),
                "seconds": max((o.seconds for o in outcomes), default=0.0),
                "errors": errors[:3],
            }
        ),
        flush=True,
    )


# --- the driver --------------------------------------------------------------------------------
def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Probe:
    """Real ext_proc requests, one at a time, on the driver's own TLS connection."""

    def __init__(self, port: int, ca: bytes) -> None:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        options = (("grpc.ssl_target_name_override", "localhost"),)
        self.channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options)
        self.method = self.channel.stream_stream(bench_ext_proc.METHOD)
        self.shapes = bench_ext_proc.captured_requests()
        self.failures = 0

    async def one(self, n: int) -> float:
        started = time.perf_counter()
        call = self.method()
        try:
            for message in self.shapes[n % len(self.shapes)]:
                await call.write(message)
                if await call.read() is grpc.aio.EOF:
                    self.failures += 1
                    break
            await call.done_writing()
            if await call.code() != grpc.StatusCode.OK:
                self.failures += 1
        except grpc.aio.AioRpcError:
            self.failures += 1
        return time.perf_counter() - started


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def measure(
    name: str, port: int, pid: int, cert_dir: Path, seconds: float, probe: Probe, probe_cpu: float
) -> dict[str, Any]:
    """One attack; ``probe_cpu``: the server's CPU seconds per second that the probe alone costs."""
    rss_before = _rss_bytes(pid)
    cpu_before = bench_ext_proc.server_cpu_seconds(pid)
    wall_before = time.monotonic()
    attacker = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "attack",
        name,
        "--port",
        str(port),
        "--cert-dir",
        str(cert_dir),
        "--seconds",
        str(seconds),
        stdout=subprocess.PIPE,
    )
    peak = rss_before
    latencies: list[float] = []

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, _rss_bytes(pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    waiting = asyncio.create_task(attacker.communicate())
    n = 0
    try:
        while not waiting.done():
            latencies.append(await probe.one(n))
            n += 1
        stdout, _ = await waiting
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    peak = max(peak, _rss_bytes(pid))
    result = json.loads(stdout.decode().strip().splitlines()[-1])
    result.update(
        rss_growth=(peak - rss_before) / 2**20,
        rss_after=(_rss_bytes(pid) - rss_before) / 2**20,
        cpu=bench_ext_proc.server_cpu_seconds(pid)
        - cpu_before
        - probe_cpu * (time.monotonic() - wall_before),
        p50=_percentile(latencies, 0.5) * 1e3,
        p99=_percentile(latencies, 0.99) * 1e3,
        probes=len(latencies),
    )
    return result


async def drive(names: list[str], seconds: float, timeouts: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-h2-") as tmp:
        cert_dir = Path(tmp)
        pair = self_signed()
        (cert_dir / "tls.crt").write_bytes(pair.cert_pem)
        (cert_dir / "tls.key").write_bytes(pair.key_pem)
        server = subprocess.Popen(  # noqa: ASYNC220 - started once, before anything runs
            [sys.executable, __file__, "serve", "--cert-dir", str(cert_dir), "--timeouts", str(timeouts)],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            probe = Probe(port, pair.cert_pem)
            for i in range(50):  # warm up
                await probe.one(i)
            cpu_before, wall_before = bench_ext_proc.server_cpu_seconds(server.pid), time.monotonic()
            baseline = [await probe.one(i) for i in range(PROBE_BASELINE)]
            probe_cpu = (bench_ext_proc.server_cpu_seconds(server.pid) - cpu_before) / (
                time.monotonic() - wall_before
            )
            base_p50, base_p99 = _percentile(baseline, 0.5) * 1e3, _percentile(baseline, 0.99) * 1e3
            print(f"server pid {server.pid}, RSS {_rss_bytes(server.pid) / 2**20:.1f} MiB after warm-up")
            print(f"normal request without attack: p50 {base_p50:.2f} ms, p99 {base_p99:.2f} ms", end=" ")
            print(f"({PROBE_BASELINE} requests)")
            print()
            header = (
                f"{'attack':26} {'conns':>5} {'RSS peak +MiB':>13} {'per conn':>8} {'after':>6} "
                f"{'+CPU s':>6} {'p50 ms':>7} {'p99 ms':>7} {'+p99':>6}  outcome"
            )
            print(header)
            for name in names:
                r = await measure(name, port, server.pid, cert_dir, seconds, probe, probe_cpu)
                conns = r["connections"]
                print(
                    f"{name:26} {conns:>5} {r['rss_growth']:>13.1f} {r['rss_growth'] / conns:>8.2f} "
                    f"{r['rss_after']:>6.1f} {r['cpu']:>6.2f} {r['p50']:>7.2f} {r['p99']:>7.2f} "
                    f"{r['p99'] - base_p99:>6.1f}  {'; '.join(r['outcomes'])} ({r['seconds']:.1f}s)"
                    + (f" errors: {r['errors']}" if r["errors"] else "")
                )
            if probe.failures:
                print(f"normal requests that failed: {probe.failures}")
            await probe.channel.close()
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", default="drive", choices=["drive", "serve", "attack"])
    parser.add_argument("name", nargs="?", default="")
    parser.add_argument("--only", default="", help="comma-separated attack names (default: all)")
    parser.add_argument("--seconds", type=float, default=10.0, help="upper bound per attack")
    parser.add_argument("--timeouts", type=float, default=2.0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cert-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.mode == "serve":
        asyncio.run(serve(args.cert_dir, args.timeouts))
    elif args.mode == "attack":
        asyncio.run(attack(args.name, args.port, (args.cert_dir / "tls.crt").read_bytes(), args.seconds))
    else:
        names = [n for n in args.only.split(",") if n] or list(ATTACKS)
        unknown = set(names) - set(ATTACKS)
        if unknown:
            parser.error(f"unknown attacks {sorted(unknown)}; known: {', '.join(ATTACKS)}")
        asyncio.run(drive(names, args.seconds, args.timeouts))


if __name__ == "__main__":
    main()
