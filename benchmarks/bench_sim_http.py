"""The vLLM simulator's own CPU per request and per streamed token, as a process over HTTP.

Every live run on this machine (the routing bench's 4-8 pods, the latency bench's one pod, the
tests' hundreds) puts simulators on the same two cores as Envoy, the EPP and the client, so what a
simulator spends per request is taken from what is measured. This script starts one simulator
process (`python -m harness.sim`, an engine fast enough never to be the bottleneck: 256 slots, time
scale 0.001) on a loopback address of its own and drives it with nghttp2's `h2load` (32 keep-alive
HTTP/1.1 connections, one request in flight on each), two loads in alternating rounds:
- **plain**: a non-streamed completion of 1 token (the latency bench's request);
- **streamed**: a streamed chat completion of 64 tokens with a usage chunk (the routing bench's kind
  of request), whose CPU per token is the figure to read.
The CPU is the simulator process's user + system time from /proc over each run. `--sim-tree DIR`
runs the simulator of another checkout instead (a `git worktree` of an older commit), so a change
can be measured against what came before on the same machine and minute. Prints, never asserts.

    .venv/bin/python benchmarks/bench_sim_http.py [--rounds 3] [--requests 40000] [--streams 3000]
    .venv/bin/python benchmarks/bench_sim_http.py --sim-tree /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import load_h2load  # beside this file
from bench_e2e_latency import cpu_seconds  # beside this file

from harness.base.addresses import AddressPool

PORT = 8000
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
STREAMED_TOKENS = 64
PLAIN = {"model": MODEL, "prompt": "Say hi.", "max_tokens": 1}
STREAMED = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hi to everyone in the room, please."}],
    "max_tokens": STREAMED_TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@dataclass(frozen=True)
class Load:
    name: str
    path: str
    body: dict[str, object]
    tokens: int  # streamed tokens per request (0: not streamed)


def start_simulator(host: str, tree: Path | None) -> subprocess.Popen[bytes]:
    # `python -m` puts its working directory first on the path, ahead of the editable install.
    cwd = tree if tree is not None else Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "harness.sim", "--host", host, "--port", str(PORT), "--admin-port", "-1"]
    command += ["--max-num-seqs", "256", "--time-scale", "0.001"]
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the simulator exited {process.returncode}: {process.stderr.read().decode()}")
        try:
            with urllib.request.urlopen(f"http://{host}:{PORT}/health", timeout=1) as response:
                if response.status == 200:
                    return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the simulator did not answer /health within 30 s")


async def measure(binary: Path, url: str, pid: int, load: Load, count: int) -> tuple[float, float]:
    """(requests per second, simulator CPU µs per request) over ``count`` requests."""
    before = cpu_seconds(pid)
    body, headers = json.dumps(load.body).encode(), {"content-type": "application/json"}
    run = await load_h2load.run(binary, url + load.path, body, headers, 32, count)
    cpu = cpu_seconds(pid) - before
    if run.failed:
        raise RuntimeError(f"{run.failed} of {count} {load.name} requests failed")
    return run.ok / run.seconds, cpu / run.ok * 1e6


LOADS = (
    Load("plain", "/v1/completions", PLAIN, 0),
    Load("streamed", "/v1/chat/completions", STREAMED, STREAMED_TOKENS),
)


async def run_rounds(
    binary: Path, url: str, pid: int, counts: dict[str, int], rounds: int
) -> dict[str, list[tuple[float, float]]]:
    """A short warm-up of each load, then ``rounds`` of both, alternating which goes first."""
    for load in LOADS:
        await measure(binary, url, pid, load, max(100, counts[load.name] // 20))
    figures: dict[str, list[tuple[float, float]]] = {load.name: [] for load in LOADS}
    for round_ in range(rounds):
        for load in LOADS if round_ % 2 == 0 else LOADS[::-1]:
            figures[load.name].append(await measure(binary, url, pid, load, counts[load.name]))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40_000, help="plain requests per round")
    parser.add_argument("--streams", type=int, default=3_000, help="streamed requests per round")
    parser.add_argument("--sim-tree", type=Path, default=None, help="run the simulator of this checkout")
    args = parser.parse_args()
    binary = load_h2load.ensure_h2load()
    counts = {"plain": args.requests, "streamed": args.streams}
    with AddressPool() as addresses:
        host = addresses.acquire()
        process = start_simulator(host, args.sim_tree)
        try:
            figures = asyncio.run(
                run_rounds(binary, f"http://{host}:{PORT}", process.pid, counts, args.rounds)
            )
        finally:
            process.terminate()
            process.wait(timeout=10)
    tree = args.sim_tree or Path(__file__).resolve().parent.parent
    print(f"simulator of {tree}; h2load, 32 connections, 1 request in flight on each; {args.rounds} rounds")
    print(f"{'load':<10} {'req/s':>8} {'CPU µs/request':>16} {'CPU µs/token':>14}   (each round)")
    for load in LOADS:
        runs = figures[load.name]
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        per_token = f"{cpu / load.tokens:14.1f}" if load.tokens else f"{'-':>14}"
        rounds = ", ".join(f"{c:.0f}" for _, c in runs)
        print(f"{load.name:<10} {rate:8.0f} {cpu:16.0f} {per_token}   ({rounds})")


if __name__ == "__main__":
    main()
