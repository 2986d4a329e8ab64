"""The node agent's costs: starting a simulator process, and kubectl apply to routed.

- **Simulator start** (from "start it" to its ``/health`` answering 200), ``--starts`` times each way:
  ``python -m harness.sim`` as a fresh process (interpreter start + imports), and a fork of the
  agent's pre-imported zygote (``harness.nodeagent.zygote``), which is how the agent starts them.
- **kubectl apply to routed**: a full control plane (with the node agent) and a Stack serving the pool
  of ``examples/cluster/vllm-sim.yaml`` (EPP process + Envoy, nothing applied); then, ``--runs``
  times: ``kubectl apply -f examples/cluster/vllm-sim.yaml`` (a 4-replica Deployment, the pool and
  two models) and the time until (a) the API shows all four pods Ready, (b) the EPP's datastore holds
  all four with scraped metrics — it routes to each from then on — and (c) requests through Envoy
  (distinct prompts, base model) have reached all four. Between runs the Deployment is deleted and
  its pods force-deleted. Target (issue 9): (b) ≤ 3 s.

Prints figures, asserts nothing:

    .venv/bin/python benchmarks/bench_node_agent.py [--starts 10] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx2

from harness.base.addresses import AddressPool
from harness.base.process import ManagedProcess
from harness.beds.stack import Stack, StackOptions
from harness.cluster.controlplane import ControlPlane
from harness.cluster.kube import Kube
from harness.cluster.kubectl import kubectl
from harness.nodeagent.runtime import Launcher, PythonEntry
from harness.sim import SERVED_BY_HEADER

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cluster" / "vllm-sim.yaml"
POOL = "vllm-llama3-8b-instruct"
NAMESPACE = "bench-agent"
REPLICAS = 4
POLL_S = 0.01
TIMEOUT_S = 60.0


def health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def poll_health(url: str) -> None:
    began = time.perf_counter()
    while not health_ok(url):
        if time.perf_counter() - began > TIMEOUT_S:
            raise TimeoutError(url)
        time.sleep(0.002)


def bench_exec(addresses: AddressPool, starts: int) -> list[float]:
    durations = []
    for _ in range(starts):
        ip = addresses.acquire()
        began = time.perf_counter()
        process = ManagedProcess(
            "sim", sys.executable, ["-m", "harness.sim", "--host", ip], health_url=f"http://{ip}:8000/health"
        )
        process.start()
        durations.append(time.perf_counter() - began)
        process.stop()
        addresses.release(ip)
    return durations


def bench_fork(addresses: AddressPool, starts: int) -> list[float]:
    async def run() -> list[float]:
        with tempfile.TemporaryDirectory(prefix="bench-zygote-") as directory:
            launcher = Launcher(("harness.sim._cli",), Path(directory) / "launcher.log")
            await launcher.start()
            durations = []
            try:
                for _ in range(starts):
                    ip = addresses.acquire()
                    began = time.perf_counter()
                    process = await launcher.run(
                        PythonEntry("harness.sim._cli:main", ("--host", ip)),
                        env={},
                        log_file=Path(directory) / "sim.log",
                        cwd=Path(directory),
                    )
                    await asyncio.to_thread(poll_health, f"http://{ip}:8000/health")
                    durations.append(time.perf_counter() - began)
                    await launcher.signal(process, signal.SIGTERM)
                    await process.exited
                    addresses.release(ip)
            finally:
                await launcher.close()
            return durations

    return asyncio.run(run())


def wait(check: Callable[[], bool], began: float) -> float:
    while not check():
        if time.perf_counter() - began > TIMEOUT_S:
            raise TimeoutError("gave up")
        time.sleep(POLL_S)
    return time.perf_counter() - began


def pods(api: Kube) -> list[dict[str, Any]]:
    return api.pods.list(NAMESPACE)


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def one_run(plane: ControlPlane, api: Kube, stack: Stack) -> tuple[float, float, float]:
    served: set[str] = set()
    with httpx2.Client(base_url=stack.base_url, timeout=30) as http:

        def all_served() -> bool:
            body = {
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "prompt": secrets.token_hex(8),
                "max_tokens": 1,
            }
            response = http.post("/completions", json=body)
            if response.status_code == 200:
                served.add(response.headers[SERVED_BY_HEADER])
            return len(served) == REPLICAS

        def routable() -> bool:
            held = stack.datastore_view().get("pods") or []
            return len([p for p in held if p.get("metricsAgeSeconds") is not None]) == REPLICAS

        def api_ready() -> bool:
            listed = pods(api)
            return len(listed) == REPLICAS and all(ready(p) for p in listed)

        began = time.perf_counter()
        kubectl(plane.kubeconfig_path, "apply", "-f", str(EXAMPLE), namespace=NAMESPACE)
        in_api = in_epp = None
        while in_api is None or in_epp is None:
            if time.perf_counter() - began > TIMEOUT_S:
                raise TimeoutError("the Deployment did not come up")
            if in_api is None and api_ready():
                in_api = time.perf_counter() - began
            if in_epp is None and routable():
                in_epp = time.perf_counter() - began
            time.sleep(POLL_S)
        through_envoy = wait(all_served, began)
    kubectl(plane.kubeconfig_path, "delete", "deployment", POOL, "--wait=false", namespace=NAMESPACE)
    kubectl(
        plane.kubeconfig_path, "delete", "pods", "--all", "--grace-period=0", "--force", namespace=NAMESPACE
    )
    wait(lambda: not pods(api) and not stack.datastore_view().get("pods"), time.perf_counter())
    return in_api, in_epp, through_envoy


def _summary(durations: Sequence[float], unit: str = "s") -> str:
    scale, digits = (1000.0, 0) if unit == "ms" else (1.0, 2)

    def text(value: float) -> str:
        return f"{value * scale:.{digits}f}"

    runs = ", ".join(text(d) for d in durations)
    return (
        f"median {text(statistics.median(durations))} {unit} (min {text(min(durations))}, max "
        f"{text(max(durations))}; runs: {runs})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--starts", type=int, default=10, help="simulator starts to time each way")
    parser.add_argument("--runs", type=int, default=5, help="kubectl apply runs to time")
    args = parser.parse_args(argv)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")

    with AddressPool() as addresses:
        fresh = bench_exec(addresses, args.starts)
        forked = bench_fork(addresses, args.starts)
    print(f"simulator start to /health 200, python -m harness.sim: {_summary(fresh, 'ms')}")
    print(f"simulator start to /health 200, fork of the agent's zygote: {_summary(forked, 'ms')}")

    with ControlPlane() as plane, plane.api_client() as api_client:
        options = StackOptions(namespace=NAMESPACE, pool_name=POOL, apply_pool=False)
        with Stack(plane.access, options) as stack:
            results = [one_run(plane, Kube(api_client), stack) for _ in range(args.runs)]
    print(
        f"kubectl apply of a {REPLICAS}-replica Deployment (examples/cluster/vllm-sim.yaml), {args.runs} runs"
    )
    print(f"  to all {REPLICAS} pods Ready in the API: {_summary([r[0] for r in results])}")
    print(f"  to the EPP routing to all {REPLICAS} (in its datastore, metrics scraped): "
          f"{_summary([r[1] for r in results])}; aim <= 3 s")  # fmt: skip
    print(f"  to requests through Envoy having reached all {REPLICAS}: {_summary([r[2] for r in results])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
