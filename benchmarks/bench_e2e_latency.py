"""What the EPP adds on the data path: Envoy → simulator direct vs Envoy + ext_proc/EPP → simulator.

One run on this machine, all paths against the same simulated vLLM pod:
- ``client -> simulator``: no Envoy at all (context only);
- ``Envoy -> simulator``: an Envoy whose bootstrap has no ext_proc filter and a STATIC upstream
  (``EnvoyOptions(direct_upstream=...)``);
- ``Envoy + EPP -> simulator``: the real data path of ``harness.stack.Stack``: ext_proc to the EPP
  process (TLS), which picks the pod from its datastore (control plane, pool, model, pod).

The simulator is a pod the node agent runs (its own process) with a tiny ``time_scale`` and enough
slots that it is never the bottleneck. Load comes from aiohttp in this process: latency at 1 request
in flight (p50/p99; the EPP's added latency is the difference to the direct path) and throughput at
32 in flight (as a ratio of the direct path). Rounds alternate the order of the paths so drift hits
both. Prints figures, asserts nothing. Targets (issue 5): ≤ 1.5 ms added at p50; ratio ≥ 0.15.

    .venv/bin/python benchmarks/bench_e2e_latency.py [--c1-requests 1000] [--c32-requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from harness.controlplane import ControlPlane
from harness.envoy import Envoy, EnvoyOptions
from harness.sim import SimConfig
from harness.stack import BASE_MODEL, ModelSpec, Stack, StackOptions

NAMESPACE = "bench"
POOL = "bench-pool"
POD = "bench-0"
SIM_PORT = 8000
MODEL = BASE_MODEL
BODY = b'{"model": "%s", "prompt": "Say hi.", "max_tokens": 1}' % MODEL.encode()
HEADERS = {"Content-Type": "application/json"}
HIGH_CONCURRENCY = 32
# The ext_proc cluster of the direct Envoy is defined but never called.
UNUSED_EXT_PROC = "127.0.0.1:9"


@dataclass
class PathStats:
    latencies_s: list[float] = field(default_factory=list)
    c1_errors: int = 0
    c32_requests: int = 0
    c32_errors: int = 0
    c32_seconds: float = 0.0

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
        return 1000 * ordered[index]

    @property
    def throughput(self) -> float:
        return self.c32_requests / self.c32_seconds if self.c32_seconds else 0.0


async def one(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.post(url, data=BODY, headers=HEADERS) as response:
        await response.read()
        return response.status == 200


async def measure_c1(url: str, count: int, deadline_s: float, stats: PathStats) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        ends = time.monotonic() + deadline_s
        for _ in range(count):
            began = time.perf_counter()
            ok = await one(session, url)
            elapsed = time.perf_counter() - began
            if ok:
                stats.latencies_s.append(elapsed)
            else:
                stats.c1_errors += 1
            if time.monotonic() > ends:
                break


async def measure_throughput(url: str, count: int, deadline_s: float, stats: PathStats) -> None:
    remaining = count
    done = errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=HIGH_CONCURRENCY)) as session:
        ends = time.monotonic() + deadline_s

        async def worker() -> None:
            nonlocal remaining, done, errors
            while remaining > 0 and time.monotonic() < ends:
                remaining -= 1
                ok = await one(session, url)
                done += 1
                errors += 0 if ok else 1

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(HIGH_CONCURRENCY)))
        stats.c32_seconds += time.perf_counter() - began
    stats.c32_requests += done - errors
    stats.c32_errors += errors


async def warm_up(url: str, count: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as session:
        await asyncio.gather(*(one(session, url) for _ in range(count)))


async def run_rounds(urls: dict[str, str], args: argparse.Namespace) -> dict[str, PathStats]:
    stats = {name: PathStats() for name in urls}
    for url in urls.values():
        await warm_up(url, args.warmup)
    names = list(urls)
    for round_index in range(args.rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            await measure_c1(urls[name], args.c1_requests // args.rounds, args.max_seconds, stats[name])
        for name in order:
            await measure_throughput(
                urls[name], args.c32_requests // args.rounds, args.max_seconds, stats[name]
            )
    return stats


def report(stats: dict[str, PathStats], labels: dict[str, str]) -> None:
    width = max(len(label) for label in labels.values()) + 2
    print(
        f"\n{'Latency at 1 request in flight (ms)':<{width + 2}}"
        f"{'p50':>7} {'p99':>7} {'mean':>7} {'n':>6} {'errors':>7}"
    )
    for name, s in stats.items():
        mean = 1000 * statistics.fmean(s.latencies_s) if s.latencies_s else float("nan")
        print(
            f"  {labels[name]:<{width}}{s.percentile_ms(50):7.2f} {s.percentile_ms(99):7.2f} {mean:7.2f}"
            f" {len(s.latencies_s):6d} {s.c1_errors:7d}"
        )
    direct, epp = stats["direct"], stats["epp"]
    added_p50 = epp.percentile_ms(50) - direct.percentile_ms(50)
    added_p99 = epp.percentile_ms(99) - direct.percentile_ms(99)
    print(
        f"  added by ext_proc + EPP: p50 {added_p50:+.2f} ms, p99 {added_p99:+.2f} ms  (target: p50 <= 1.5)"
    )
    print(
        f"\n{f'Throughput at {HIGH_CONCURRENCY} in flight':<{width + 2}}{'req/s':>10} {'n':>7} {'errors':>7}"
    )
    for name, s in stats.items():
        print(f"  {labels[name]:<{width}}{s.throughput:10.0f} {s.c32_requests:7d} {s.c32_errors:7d}")
    ratio = epp.throughput / direct.throughput if direct.throughput else float("nan")
    print(f"  Envoy + EPP as a ratio of Envoy direct: {ratio:.2f}   (target: >= 0.15)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--c1-requests", type=int, default=1000, help="sequential requests per path")
    parser.add_argument("--c32-requests", type=int, default=3000, help="requests per path at 32 in flight")
    parser.add_argument("--warmup", type=int, default=200, help="requests per path before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds the counts are split over")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="cap of one measurement of one path")
    parser.add_argument("--time-scale", type=float, default=0.001, help="simulator time scale")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (others' work counts too)")
    with ControlPlane() as plane:
        options = StackOptions(
            namespace=NAMESPACE,
            pool_name=POOL,
            pods=0,
            models=(ModelSpec("bench", MODEL, "Critical"),),
            envoy=EnvoyOptions(log_level="warning"),
        )
        with Stack(plane.access, options) as stack:
            assert stack.cluster is not None
            assert stack.envoy is not None
            sim = SimConfig(model=MODEL, max_num_seqs=256, time_scale=args.time_scale)
            ip = stack.cluster.add_pod(POD, {"app": POOL}, sim_config=sim, ports=(SIM_PORT,)).ip
            stack.wait_pods_scraped(1)
            direct_options = EnvoyOptions(log_level="warning", direct_upstream=f"{ip}:{SIM_PORT}")
            with Envoy(UNUSED_EXT_PROC, options=direct_options) as direct:
                urls = {
                    "sim": f"http://{ip}:{SIM_PORT}/v1/completions",
                    "direct": f"{direct.base_url}/v1/completions",
                    "epp": f"{stack.envoy.base_url}/v1/completions",
                }
                labels = {
                    "sim": "client -> simulator (no Envoy)",
                    "direct": "Envoy -> simulator (no ext_proc)",
                    "epp": "Envoy + EPP -> simulator",
                }
                print(
                    f"measuring: {args.c1_requests} sequential and {args.c32_requests} at {HIGH_CONCURRENCY}"
                    f" in flight per path, {args.rounds} alternating rounds, simulator time_scale"
                    f" {args.time_scale}"
                )
                began = time.monotonic()
                stats = asyncio.run(run_rounds(urls, args))
                print(f"measured in {time.monotonic() - began:.1f} s")
    report(stats, labels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
