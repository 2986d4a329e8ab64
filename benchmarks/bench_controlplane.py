"""Control-plane costs: cold start of the full and the minimal plane, and the per-test namespace fixture.

- **Cold start, full plane**: ``ControlPlane()`` from nothing to ready: etcd, kube-apiserver
  (``/readyz`` OK, the ``default`` namespace present), kube-scheduler and kube-controller-manager
  (``/healthz`` OK, the ``default`` ServiceAccount created), the node agent (its nodes registered
  and schedulable, its watches listed), the upstream CRDs Established and in discovery; binaries
  already cached. Then a stop. Median of ``--runs`` (default 5). Target (issue 8): ≤ 4 s on this
  2-core machine. Also without the node agent (``CONTROLLERS``), for what the agent adds.
- **Cold start, minimal plane**: the same with ``components=MINIMAL`` (etcd + kube-apiserver + CRDs).
  Target: ≤ 3 s.
- **Namespace fixture**: what the ``namespace`` fixture does per test against the full plane (create
  a namespace, wait for its ``default`` ServiceAccount, request its deletion without waiting), timed
  directly; and end to end, as the difference between two inner pytest runs against that same
  cluster (``--kubeconfig``) with N tests that do and do not use the fixture, divided by N.
  Target: ≤ 100 ms.

Prints figures, asserts nothing:

    .venv/bin/python benchmarks/bench_controlplane.py [--runs 5] [--namespaces 50]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from kubernetes import client

from harness.cluster.controlplane import CONTROLLERS, FULL, MINIMAL, ControlPlane
from harness.cluster.go_binaries import ensure_all
from harness.cluster.namespaces import create_namespace, namespace_name

INNER_WITH = """
import pytest
@pytest.mark.parametrize("n", range({n}))
def test_with_namespace(namespace, n):
    pass
"""
INNER_WITHOUT = """
import pytest
@pytest.mark.parametrize("n", range({n}))
def test_without_namespace(control_plane, n):
    pass
"""


def bench_cold_start(runs: int, components: Collection[str]) -> list[float]:
    durations = []
    for _ in range(runs):
        started = time.perf_counter()
        plane = ControlPlane(components=components)
        plane.start()
        durations.append(time.perf_counter() - started)
        plane.stop()
    return durations


def bench_namespace_direct(plane: ControlPlane, count: int) -> list[float]:
    durations = []
    for i in range(count):
        started = time.perf_counter()
        with plane.api_client() as api_client:
            name = namespace_name(f"bench-{i}")
            create_namespace(api_client, name)
            client.CoreV1Api(api_client).delete_namespace(name)
        durations.append(time.perf_counter() - started)
    return durations


def bench_namespace_pytest(plane: ControlPlane, count: int) -> tuple[float, float]:
    """Wall time of two inner pytest runs (same cluster), with and without the namespace fixture."""
    times = []
    with tempfile.TemporaryDirectory(prefix="bench-ns-") as directory:
        for name, template in (("test_with.py", INNER_WITH), ("test_without.py", INNER_WITHOUT)):
            path = Path(directory, name)
            path.write_text(template.format(n=count))
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kubeconfig",
                       str(plane.kubeconfig_path), str(path)]  # fmt: skip
            started = time.perf_counter()
            subprocess.run(command, cwd=directory, check=True, capture_output=True)
            times.append(time.perf_counter() - started)
    return times[0], times[1]


def _summary(durations: list[float]) -> str:
    return (
        f"median {statistics.median(durations):.2f} s (min {min(durations):.2f}, max {max(durations):.2f}; "
        f"runs: {', '.join(f'{d:.2f}' for d in durations)})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="cold starts to time (default %(default)s)")
    parser.add_argument("--namespaces", type=int, default=50, help="namespaces per measurement")
    args = parser.parse_args(argv)

    for name, resolved in ensure_all().items():
        print(f"{name}: {resolved.path} ({resolved.source})")

    full = bench_cold_start(args.runs, FULL)
    print(f"cold start, full plane (etcd, apiserver, scheduler, controller-manager, node agent, CRDs): "
          f"{_summary(full)}")  # fmt: skip
    controllers = bench_cold_start(args.runs, CONTROLLERS)
    print(f"cold start, the same without the node agent: {_summary(controllers)}")
    minimal = bench_cold_start(args.runs, MINIMAL)
    print(f"cold start, minimal plane (etcd, apiserver, CRDs): {_summary(minimal)}")

    with ControlPlane() as plane:
        direct = bench_namespace_direct(plane, args.namespaces)
        print(
            f"namespace fixture work (client + create + default ServiceAccount + delete request), "
            f"{args.namespaces} runs: median {statistics.median(direct) * 1000:.1f} ms, p90 "
            f"{statistics.quantiles(direct, n=10)[-1] * 1000:.1f} ms"
        )
        with_ns, without_ns = bench_namespace_pytest(plane, args.namespaces)
        per_test = (with_ns - without_ns) / args.namespaces
        print(
            f"namespace fixture end to end in pytest: {per_test * 1000:.1f} ms per test "
            f"({args.namespaces} tests: {with_ns:.2f} s with, {without_ns:.2f} s without)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
