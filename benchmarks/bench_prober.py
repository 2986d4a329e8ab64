"""Prober cost: CPU per parse and per scrape of a realistic vLLM /metrics page, and pods per core.

1. Parse only: the targeted scan vs `prometheus_client`'s full parser on the same ~45 KB page.
2. Live: N local HTTP servers (a child process, so their CPU is not counted) each serve the page on
   127.0.0.2 onwards at one shared port (pods share the pool's target port); the real `PodRefreshers`,
   `MetricsFetcher` and datastore probe them every 50 ms for a few seconds. Process CPU time over the
   run gives CPU per scrape, and from it the pods one core can probe at 50 ms (target ≥ 100).
Prints figures, asserts nothing.

    .venv/bin/python benchmarks/bench_prober.py [--pods 100] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_page import vllm_metrics_page

from epp.api.types import InferencePool, NamespacedName, PodObject
from epp.backend.metrics import MetricsFetcher, PodRefreshers, new_scrape_session
from epp.backend.metrics.parse import compile_metric_names, parse_page
from epp.config import MetricNames, ProberConfig
from epp.datastore import new_datastore
from epp.datastore.types import Metrics

INTERVAL = 0.05


def bench_parse(page: str) -> None:
    plan = compile_metric_names(MetricNames())
    rounds = 2000
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            parse_page(page, plan, Metrics(), 1.0)
        best = min(best, (time.perf_counter() - start) / rounds)
    ref_rounds = 20
    start = time.perf_counter()
    for _ in range(ref_rounds):
        for _ in text_string_to_metric_families(page):
            pass
    ref = (time.perf_counter() - start) / ref_rounds
    print(f"page: {len(page.encode()) / 1024:.1f} KiB, {page.count(chr(10))} lines")
    print(f"  targeted scan + parse : {best * 1e6:8.1f} µs/page")
    print(f"  prometheus_client     : {ref * 1e6:8.1f} µs/page (full parse, reference)")


# --- child process: N servers -----------------------------------------------------------------------
async def serve(n: int) -> None:
    from aiohttp import web

    body = vllm_metrics_page().encode()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = _shared_port(n)
    for i in range(n):
        await web.TCPSite(runner, address(i), port, reuse_address=True).start()
    print(json.dumps({"port": port}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
    await runner.cleanup()


def address(i: int) -> str:
    """Pod i's loopback address: 127.0.0.2, 127.0.0.3, ... (any 127/8 address works on Linux)."""
    return f"127.0.{i // 250}.{i % 250 + 2}"


def _shared_port(n: int) -> int:
    """A port free on every pod address (pods share the pool's target port)."""
    for _ in range(20):
        with socket.socket() as probe:
            probe.bind((address(0), 0))
            port = int(probe.getsockname()[1])
        try:
            held = []
            for i in range(n):
                s = socket.socket()
                held.append(s)
                s.bind((address(i), port))
            return port
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no port free on every address")


# --- parent: probe them -----------------------------------------------------------------------------
class CountingFetcher:
    def __init__(self, inner: MetricsFetcher) -> None:
        self.inner = inner
        self.scrapes = 0
        self.failures = 0

    async def fetch(self, address: str, port: int) -> str:
        try:
            text = await self.inner.fetch(address, port)
        except Exception:
            self.failures += 1
            raise
        self.scrapes += 1
        return text


async def probe(n: int, port: int, seconds: float) -> None:
    session = new_scrape_session()
    fetcher = CountingFetcher(MetricsFetcher(session))
    refreshers = await PodRefreshers.create(fetcher, ProberConfig(refresh_interval=INTERVAL))
    store = new_datastore(refreshers)
    store.pool_set(InferencePool(NamespacedName("default", "pool"), {"app": "vllm"}, (port,)))
    try:
        for i in range(n):
            store.pod_update_or_add(
                PodObject(NamespacedName("default", f"pod-{i}"), {"app": "vllm"}, address(i), ready=True)
            )
        await asyncio.sleep(1.0)  # warm-up: connections opened, first scrapes done
        scrapes0, cpu0, wall0 = fetcher.scrapes, time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        scrapes, cpu, wall = (
            fetcher.scrapes - scrapes0,
            time.process_time() - cpu0,
            time.perf_counter() - wall0,
        )
    finally:
        await refreshers.aclose()
        await session.close()
    per_scrape = cpu / max(scrapes, 1)
    fresh = sum(1 for p in store.pod_get_all() if p.metrics.updated_at is not None)
    print(f"live probing: {n} pods every {INTERVAL * 1000:g} ms for {wall:.1f} s")
    rate, ideal = scrapes / wall, n / INTERVAL
    print(f"  scrapes           : {scrapes} ({rate:.0f}/s; ideal {ideal:.0f}/s), failures {fetcher.failures}")
    print(f"  prober CPU        : {cpu:.2f} s = {cpu / wall * 100:.0f}% of one core")
    print(f"  CPU per scrape    : {per_scrape * 1e6:.0f} µs (HTTP + parse + store)")
    print(f"  pods per core @50ms: {1 / (per_scrape / INTERVAL):.0f} (target ≥ 100)")
    print(f"  pods with metrics : {fresh}/{n}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    bench_parse(vllm_metrics_page())
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(args.pods)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = json.loads(child.stdout.readline())["port"]
        asyncio.run(probe(args.pods, port, args.seconds))
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


if __name__ == "__main__":
    main()
