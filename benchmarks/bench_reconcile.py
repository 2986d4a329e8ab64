"""Reconcile latency: from a pod's Ready flip written to the API server until the EPP's datastore shows it.

A private control plane (etcd + kube-apiserver), the real EPP in process, one pool and a few pods.
The forged kubelet (harness.cluster.forged: a status write at a known moment) flips one pod Ready <-> NotReady
through the status subresource, N times; after each write the script polls `/debug/datastore` over
one keep-alive connection, as fast as it answers, until the pod is absent (NotReady) or present again
(Ready). Two figures per transition:

- from the write's start (the kubelet's read-modify-write: GET then PATCH) to the view changing;
- from the write acknowledged (PATCH returned) to the view changing (0 when the view changed first).

The path measured is watch delivery, informer, work queue, reconciler and datastore, plus one
view poll. Prints p50/p90/p99/max; asserts nothing (target: p99 <= 100 ms).

    .venv/bin/python benchmarks/bench_reconcile.py [--transitions 200] [--pods 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time
from urllib.parse import urlparse

from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ControlPlane
from harness.cluster.namespaces import create_namespace

NAMESPACE = "bench-reconcile"
TIMEOUT_S = 10.0


class ViewPoller:
    """GET /debug/datastore on one keep-alive connection; `pods()` = the pod names it holds."""

    def __init__(self, base_url: str) -> None:
        url = urlparse(base_url)
        assert url.hostname is not None
        assert url.port is not None
        self._conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
        self.polls = 0

    def pods(self) -> set[str]:
        self.polls += 1
        self._conn.request("GET", "/debug/datastore")
        resp = self._conn.getresponse()
        view = json.loads(resp.read())
        return {p["name"] for p in view["pods"]}

    def wait(self, pod: str, present: bool) -> float:
        """Poll until `pod` is (or is not) in the view; the perf_counter reading of that poll."""
        deadline = time.perf_counter() + TIMEOUT_S
        while True:
            if (pod in self.pods()) == present:
                return time.perf_counter()
            if time.perf_counter() > deadline:
                raise TimeoutError("the datastore view did not change in time")

    def close(self) -> None:
        self._conn.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def report(title: str, samples: list[float]) -> None:
    ms = [s * 1000 for s in samples]
    print(
        f"  {title:<38} p50 {percentile(ms, 50):6.1f}  p90 {percentile(ms, 90):6.1f}  "
        f"p99 {percentile(ms, 99):6.1f}  max {max(ms):6.1f}  mean {statistics.fmean(ms):6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transitions", type=int, default=200, help="Ready/NotReady flips to time")
    parser.add_argument("--pods", type=int, default=3, help="pods in the pool (one of them flips)")
    args = parser.parse_args()

    with ControlPlane() as plane, plane.api_client() as api:
        create_namespace(api, NAMESPACE)
        with TestBed(api, NAMESPACE, plane.kubeconfig_path) as bed:
            bed.start_epp()
            bed.apply_pool()
            for i in range(args.pods):  # forged: the benchmark times the EPP from an exact status write
                bed.add_forged_pod(f"p{i}")
            bed.eventually_consistent()
            poller = ViewPoller(bed.epp.debug_url)
            from_start: list[float] = []
            from_ack: list[float] = []
            flipping = "p0"
            try:
                for i in range(args.transitions):
                    to_ready = i % 2 == 1
                    started = time.perf_counter()
                    if to_ready:
                        bed.forged_ready(flipping)
                    else:
                        bed.forged_unready(flipping)
                    acked = time.perf_counter()
                    seen = poller.wait(flipping, present=to_ready)
                    from_start.append(seen - started)
                    from_ack.append(max(0.0, seen - acked))
                polls = poller.polls
            finally:
                poller.close()
            bed.eventually_consistent()

    print(f"reconcile latency over {args.transitions} Ready<->NotReady transitions ({args.pods} pods):")
    report("write start -> datastore view", from_start)
    report("write acknowledged -> datastore view", from_ack)
    print(f"  view polls: {polls} ({polls / args.transitions:.1f} per transition); target p99 <= 100 ms")


if __name__ == "__main__":
    main()
