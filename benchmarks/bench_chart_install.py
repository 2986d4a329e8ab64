"""The chart installed with helm in the harness's cluster: time from `helm install` to the first routed
request, and requests lost while one of two EPP replicas is deleted under load.

A private full control plane (etcd, kube-apiserver, scheduler, controller-manager, node agent). Per
round, in a namespace of its own: the model servers of `examples/cluster/vllm-sim.yaml` (2 replicas,
Ready before the clock starts), then

- **install to first routed request**: `helm install` of `deploy/chart` (2 EPP replicas) starts the
  clock; the controller-manager makes the EPP pods, the node agent runs them (in-cluster config from
  the projected token), both pass their gRPC readiness probe, Envoy starts with both pod addresses,
  and requests are sent until one is answered 200. Printed with its steps (helm returned, pods Ready,
  Envoy up, first 200).
- **requests lost while an EPP replica is deleted**: `--in-flight` clients keep requests in flight
  through Envoy (closed loop); one EPP pod is deleted (`kubectl delete pod`, the chart's grace period)
  and the load continues until the pod is gone and the Deployment's replacement is Ready, then 3 s
  more. Failed requests are counted (aim 0).

    .venv/bin/python benchmarks/bench_chart_install.py [--rounds 3] [--in-flight 32]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from harness.cluster.controlplane import ControlPlane
from harness.cluster.namespaces import create_namespace
from harness.dataplane.closed_loop import ClosedLoopLoad
from harness.subject.chart_install import BASE_MODEL, ChartInstall, ChartOptions

TIMEOUT_S = 180.0
STEADY_S = 3.0


def request(client_id: int) -> dict[str, Any]:
    return {"model": BASE_MODEL, "prompt": f"client {client_id}", "max_tokens": 60}


def first_routed(base_url: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    body = {"model": BASE_MODEL, "prompt": "first", "max_tokens": 1}
    while time.monotonic() < deadline:
        try:
            if requests.post(f"{base_url}/completions", json=body, timeout=30).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.02)
    raise TimeoutError("no request was routed")


def one_round(plane: ControlPlane, index: int, in_flight: int, work: Path) -> dict[str, float]:
    namespace = f"bench-chart-{index}"
    with plane.access.api_client() as api_client:
        create_namespace(api_client, namespace)
    install = ChartInstall(plane.access, namespace, work / namespace, ChartOptions(replicas=2))
    try:
        install.apply_model_servers()
        install.wait_epp_ready(count=0)  # the model servers only: the clock starts at helm install
        started = time.monotonic()
        install.install()
        helm_returned = time.monotonic()
        pods = install.wait_epp_ready(timeout=TIMEOUT_S)
        pods_ready = time.monotonic()
        install.start_envoy(pods)
        envoy_up = time.monotonic()
        first_routed(install.base_url)
        routed = time.monotonic()
        figures = {"install_to_routed_s": routed - started, "helm_s": helm_returned - started,
                   "pods_ready_s": pods_ready - started, "envoy_s": envoy_up - started}  # fmt: skip

        with ClosedLoopLoad(f"{install.base_url}/completions", request, concurrency=in_flight) as load:
            time.sleep(STEADY_S)
            victim = pods[0]["metadata"]["name"]
            deleted_at = time.monotonic()
            install.kubectl("delete", "pod", victim, "--wait=false")
            deadline = deleted_at + TIMEOUT_S
            while time.monotonic() < deadline:
                names = [p["metadata"]["name"] for p in install.epp_pods()]
                if victim not in names and len(install.serving_epp_pods()) == 2:
                    break
                time.sleep(0.1)
            replaced = time.monotonic()
            time.sleep(STEADY_S)
        outcomes = load.outcomes()
        figures.update(
            lost=float(sum(1 for o in outcomes if not o.ok)),
            sent=float(len(outcomes)),
            during=float(sum(1 for o in outcomes if o.ended >= deleted_at and o.started <= replaced)),
            replaced_s=replaced - deleted_at,
        )
        return figures
    finally:
        install.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rounds: list[dict[str, float]] = []
    with ControlPlane() as plane, tempfile.TemporaryDirectory(prefix="bench-chart-") as work:
        for index in range(args.rounds):
            figures = one_round(plane, index, args.in_flight, Path(work))
            rounds.append(figures)
            f = figures
            print(
                f"round {index + 1}: helm install -> first routed request {f['install_to_routed_s']:.1f} s "
                f"(helm returned {f['helm_s']:.1f} s, both EPP pods Ready {f['pods_ready_s']:.1f} s, "
                f"Envoy up {f['envoy_s']:.1f} s); one of 2 EPP pods deleted under {args.in_flight} in "
                f"flight: {f['lost']:.0f} of {f['sent']:.0f} requests failed "
                f"({f['during']:.0f} while the pod drained and was replaced, {f['replaced_s']:.1f} s)",
                flush=True,
            )
    lost = sum(r["lost"] for r in rounds)
    median = statistics.median(r["install_to_routed_s"] for r in rounds)
    print(f"\nhelm install -> first routed request: median {median:.1f} s over {len(rounds)} rounds")
    print(f"requests lost while one of two EPP replicas was deleted: {lost:.0f} in total (aim 0)")


if __name__ == "__main__":
    main()
