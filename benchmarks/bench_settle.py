"""Settle-barrier overhead: how long one `TestBed.settled()` call takes.

A private control plane (etcd + kube-apiserver), the real EPP in process, one pool and a few pods.
Two cases, each timed per call of `settled()` exactly as tests make it (one `/debug/datastore` GET
per poll over a fresh connection, polls 5 ms apart):

- idle: nothing was written since the last settle; the first poll already shows the EPP settled;
- after one write: the forged kubelet (harness.cluster.forged) has just flipped one pod Ready <-> NotReady
  (the write has returned), so the call waits for watch delivery, the pod reconcile and polls.

Prints p50/p90/p99/max and the polls per call; asserts nothing (aim: p50 <= 20 ms per call).

    .venv/bin/python benchmarks/bench_settle.py [--calls 200] [--pods 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from kubernetes import client

from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ControlPlane

NAMESPACE = "bench-settle"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def report(title: str, samples: list[float]) -> None:
    ms = [s * 1000 for s in samples]
    print(
        f"  {title:<28} p50 {percentile(ms, 50):6.1f}  p90 {percentile(ms, 90):6.1f}  "
        f"p99 {percentile(ms, 99):6.1f}  max {max(ms):6.1f}  mean {statistics.fmean(ms):6.1f} ms"
    )


class CountingView:
    """The bed's view reader, counting the GETs the barrier makes."""

    def __init__(self, bed: TestBed) -> None:
        self._bed = bed
        self.reads = 0

    def __call__(self) -> dict[str, object]:
        self.reads += 1
        return self._bed.epp.datastore_view()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200, help="settle calls to time in each case")
    parser.add_argument("--pods", type=int, default=3, help="pods in the pool (one of them flips)")
    args = parser.parse_args()

    with ControlPlane() as plane, plane.api_client() as api:
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace.model_validate({"metadata": {"name": NAMESPACE}}), _preload_content=False
        )
        with TestBed(api, NAMESPACE, plane.kubeconfig_path) as bed:
            bed.start_epp()
            bed.apply_pool()
            for i in range(args.pods):  # forged: the benchmark times the EPP from an exact status write
                bed.add_forged_pod(f"p{i}")
            bed.eventually_consistent()
            view = CountingView(bed)

            def settle() -> float:
                started = time.perf_counter()
                bed.settle_barrier.wait(view)  # what `bed.settled()` does, with the reads counted
                return time.perf_counter() - started

            idle = [settle() for _ in range(args.calls)]
            idle_reads, view.reads = view.reads, 0

            after_write: list[float] = []
            for i in range(args.calls):
                if i % 2:
                    bed.forged_ready("p0")
                else:
                    bed.forged_unready("p0")
                after_write.append(settle())
            write_reads = view.reads
            bed.eventually_consistent()

    print(f"settle barrier, {args.calls} calls per case ({args.pods} pods, EPP in process):")
    report("EPP already idle", idle)
    report("after one write", after_write)
    per_call = f"{idle_reads / args.calls:.1f} idle, {write_reads / args.calls:.1f} after a write"
    print(f"  view reads per call: {per_call}; aim p50 <= 20 ms")


if __name__ == "__main__":
    main()
