"""Control-plane faults: how long the EPP takes to converge (datastore = the consistency oracle).

Each round starts a `harness.beds.fault_rig.FaultRig` (its own etcd + kube-apiserver, a TCP proxy between
the in-process EPP and the API server, a TestBed with a pool, a model and three pods, the EPP's watch
bookmark interval `--interval`), injects one fault into the real processes, writes one of each pod
change (a new pod, one made unready, one deleted) and polls the oracle every 10 ms until the EPP's
datastore equals it. Printed per fault: the time the fault took (restart, etc.) and the time to
converge, counted from the moment the API was back (or, for the half-open watch, from the freeze):

- apiserver restart: SIGTERM kube-apiserver, start it on the same port and data (after `--outage`
  seconds down); from /readyz OK;
- etcd restart: SIGTERM etcd, start it on its data; from kube-apiserver's /readyz OK again;
- 410 Gone: pods' watch cache off (`--watch-cache-sizes=pods#0`), the EPP cut off by the proxy
  while the pods change, etcd compacted past the EPP's resourceVersion, the path restored; from the
  restore (the EPP must get 410 and relist);
- half-open watch: the proxy freezes every open connection (no FIN, no RST) and pods change; from
  the freeze (bound: two bookmark intervals plus the reconnect).

Aims (issue 12): <= 2 s after the API is back; <= 2 bookmark intervals for the half-open watch.
Asserts nothing.

    .venv/bin/python benchmarks/bench_control_plane_faults.py [--rounds 3] [--interval 2] [--outage 0]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

from harness.beds.fault_rig import FaultRig
from harness.beds.testbed import TestBed

POLL_S = 0.01
CONVERGE_TIMEOUT_S = 120.0


def serving(bed: TestBed) -> None:
    bed.start_epp()
    bed.apply_pool()
    bed.apply_model("chat", criticality="Critical")
    for name in ("p0", "p1", "p2"):
        bed.add_pod(name)
    bed.eventually_consistent(timeout=60)


def change_pods(bed: TestBed) -> None:
    bed.add_pod("p3")
    bed.pod_unready("p0")
    bed.delete_pod("p1")


def converged_after(bed: TestBed, since: float) -> float:
    """Seconds from `since` until the datastore first equals the oracle."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    while time.monotonic() < deadline:
        if bed.verdict().consistent:
            return time.monotonic() - since
        time.sleep(POLL_S)
    raise TimeoutError(f"not consistent after {CONVERGE_TIMEOUT_S}s: {bed.verdict().summary()}")


# How long kube-apiserver stays down before it is started again (--outage).
OUTAGE_S = [0.0]


def apiserver_restart(rig: FaultRig) -> tuple[float, float]:
    started = time.monotonic()
    rig.plane.stop_apiserver()
    time.sleep(OUTAGE_S[0])
    rig.plane.start_apiserver()
    back = time.monotonic()
    change_pods(rig.bed)
    return back - started, converged_after(rig.bed, back)


def etcd_restart(rig: FaultRig) -> tuple[float, float]:
    started = time.monotonic()
    rig.plane.restart_etcd()
    back = time.monotonic()
    change_pods(rig.bed)
    return back - started, converged_after(rig.bed, back)


def gone_after_compaction(rig: FaultRig) -> tuple[float, float]:
    assert rig.proxy is not None
    started = time.monotonic()
    rig.proxy.cut()
    change_pods(rig.bed)
    rig.plane.compact_etcd()
    rig.proxy.restore()
    back = time.monotonic()
    took = converged_after(rig.bed, back)
    relists = int(rig.bed.view()["watches"]["pods"]["relists"])
    if relists < 1:
        raise RuntimeError("the EPP resumed without a 410: the fault did not happen")
    return back - started, took


def half_open(rig: FaultRig) -> tuple[float, float]:
    assert rig.proxy is not None
    frozen_at = time.monotonic()
    if rig.proxy.freeze() < 1:
        raise RuntimeError("no connection to freeze")
    change_pods(rig.bed)
    return 0.0, converged_after(rig.bed, frozen_at)


FAULTS: dict[str, tuple[Callable[[FaultRig], tuple[float, float]], tuple[str, ...]]] = {
    "apiserver restart": (apiserver_restart, ()),
    "etcd restart (same data)": (etcd_restart, ()),
    "410 Gone after compaction": (gone_after_compaction, ("--watch-cache-sizes=pods#0",)),
    "half-open watch": (half_open, ()),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per fault (a fresh cluster each)")
    parser.add_argument("--interval", type=float, default=2.0, help="the EPP's --watchBookmarkInterval (s)")
    parser.add_argument("--only", choices=sorted(FAULTS), help="one fault only")
    parser.add_argument(
        "--outage", type=float, default=0.0, help="keep kube-apiserver down this long before restarting it"
    )
    args = parser.parse_args()
    OUTAGE_S[0] = args.outage
    logging.basicConfig(level=logging.ERROR)  # the EPP's warnings about its broken watches are expected

    print(f"EPP watch bookmark interval {args.interval:g} s; {args.rounds} rounds per fault\n")
    print(f"  {'fault':<28} {'fault took':>12} {'converged in (each round)':>34} {'median':>8}")
    for name, (inject, apiserver_args) in FAULTS.items():
        if args.only and name != args.only:
            continue
        took: list[float] = []
        converged: list[float] = []
        for _ in range(args.rounds):
            with FaultRig(apiserver_args=apiserver_args, watch_bookmark_interval=args.interval) as rig:
                serving(rig.bed)
                fault_s, converge_s = inject(rig)
            took.append(fault_s)
            converged.append(converge_s)
        rounds = " ".join(f"{c:5.2f}" for c in converged)
        print(
            f"  {name:<28} {statistics.median(took):10.2f} s {rounds:>32} s "
            f"{statistics.median(converged):6.2f} s"
        )
    print(f"\n  aim: <= 2 s after the API is back; half-open <= 2 intervals = {2 * args.interval:g} s")


if __name__ == "__main__":
    main()
