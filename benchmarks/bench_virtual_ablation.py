"""Why one scoring profile beats another in virtual time: the same trace through EPP profiles and peers.

`harness bench routing --virtual` compares the EPP's default profile with other routers; this script
takes the EPP apart. It replays one trace (a workload at a load, seed 1, as the bench makes it)
through the EPP's real scheduling code with the scoring profiles named below and through the
bench's peers, every run on fresh engines in the same virtual-time loop, and prints per policy:
TTFT p50/p90/p99, goodput, imbalance and **close arrivals**: the share of each pod's consecutive
arrivals less than 10 ms apart (about one engine step at 0.9x capacity). Two requests that close
together on one engine share its next step, so their prefills lengthen each other's first token;
round robin spaces them, a router that herds does not.

    .venv/bin/python benchmarks/bench_virtual_ablation.py                       # sharegpt, 16 pods x 4,000
    .venv/bin/python benchmarks/bench_virtual_ablation.py --workload lora --profiles default,before
    .venv/bin/python benchmarks/bench_virtual_ablation.py --pods 16 --run-pods 160 --profiles round-robin

``--run-pods`` serves the trace (sized for ``--pods``) on more engines: with 10x the engines each one
is nearly idle, which shows the TTFT floor of the trace's prompts on this engine.
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import replace

from epp.config import SchedulerConfig, ScoringProfile, WeightedScorer
from harness.cli.bench.virtual.cluster import ClusterConfig, Record, VirtualCluster
from harness.cli.bench.virtual.routers import ALL, EPP, EppRouter, make_router
from harness.cli.bench.virtual.runner import VirtualConfig, measure_capacity, summarize, virtual_sim
from harness.cli.bench.workload import generate
from harness.cli.bench.workloads import named_workload

CLOSE_S = 0.010
# The default before the predicted-TTFT scorer (6 Dec 2026), and the default now.
BEFORE = {"queue": 1.0, "kv_cache": 1.0, "in_flight": 2.0, "lora": 3.0, "prefix": 2.0}
DEFAULT = {s.kind: s.weight for s in SchedulerConfig().scoring_profile.scorers if s.weight > 0}
PROFILES: dict[str, dict[str, float]] = {
    "default": DEFAULT,
    "default+last-routed": {**DEFAULT, "last_routed": 1.0},
    "default-no-in-flight": {k: w for k, w in DEFAULT.items() if k != "in_flight"},
    "predicted-ttft-only": {"predicted_ttft": 1.0},
    "before": BEFORE,
    "before-no-kv": {**BEFORE, "kv_cache": 0.0},
    "before-no-queue": {**BEFORE, "queue": 0.0},
    "in-flight-only": {"in_flight": 1.0},
    "last-routed": {**BEFORE, "last_routed": 1.0},  # the opt-in (epp[last-routed] in the bench)
    "last-routed-2": {**BEFORE, "last_routed": 2.0},
    "last-routed-0.3": {**BEFORE, "last_routed": 0.3},
    "last-routed-0.5": {**BEFORE, "last_routed": 0.5},
    "last-routed-no-queue": {**BEFORE, "queue": 0.0, "last_routed": 1.0},
    "last-routed-half-queue": {**BEFORE, "queue": 0.5, "last_routed": 1.0},
}
PEERS = tuple(p for p in ALL if p != EPP)


def profile_config(weights: dict[str, float]) -> SchedulerConfig:
    return SchedulerConfig(profile=ScoringProfile(tuple(WeightedScorer(k, w) for k, w in weights.items())))


def close_arrivals(records: list[Record]) -> float:
    """The share of each pod's consecutive arrivals less than CLOSE_S apart."""
    by_pod: dict[int, list[float]] = {}
    for r in records:
        if r.pod >= 0:
            by_pod.setdefault(r.pod, []).append(r.request.at)
    gaps: list[float] = []
    for times in by_pod.values():
        ordered = sorted(times)
        gaps.extend(b - a for a, b in itertools.pairwise(ordered))
    return sum(1 for g in gaps if g < CLOSE_S) / max(1, len(gaps))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="sharegpt")
    parser.add_argument("--pods", type=int, default=16, help="engines the trace's rate is sized for")
    parser.add_argument("--run-pods", type=int, default=0, help="engines that serve it (default: --pods)")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument(
        "--profiles",
        default="round-robin,least-outstanding,default,predicted-ttft-only,before,last-routed",
        help=f"comma list of EPP profiles ({', '.join(PROFILES)}) and peers ({', '.join(PEERS)})",
    )
    args = parser.parse_args()
    names = [n for n in args.profiles.split(",") if n]
    unknown = [n for n in names if n not in PROFILES and n not in PEERS]
    if unknown:
        parser.error(f"unknown profile or peer: {', '.join(unknown)}")
    config = VirtualConfig(workload=args.workload, pods=args.pods, requests=args.requests)
    sim = virtual_sim(config)
    capacity = measure_capacity(config, sim)
    spec = named_workload(args.workload, sim.model).spec
    trace = generate(replace(spec, requests=args.requests, rate=args.load * capacity, seed=config.seed))
    run_pods = args.run_pods or args.pods
    print(
        f"{args.workload}: {args.requests} requests at {args.load}x the capacity of {args.pods} engines "
        f"({args.load * capacity:.0f}/s), served by {run_pods}"
    )
    print(
        f"{'policy':24s} {'TTFT p50':>9s} {'p90':>7s} {'p99':>7s} {'goodput':>8s} {'imbal.':>6s} close<10ms"
    )
    for name in names:
        router = (
            EppRouter(name, profile_config(PROFILES[name]), config.seed)
            if name in PROFILES
            else make_router(name, config.seed)
        )
        cluster = VirtualCluster(ClusterConfig(run_pods, sim, seed=config.seed))
        started = time.monotonic()
        records = cluster.run(trace.requests, router)
        run = summarize(name, args.load, 0, records, cluster, config, time.monotonic() - started)
        t = {k: v * 1e3 for k, v in run.ttft.items()}
        print(
            f"{name:24s} {t['p50']:7.1f}ms {t['p90']:5.1f}ms {t['p99']:5.1f}ms {run.goodput_rps:8.1f} "
            f"{run.imbalance:6.2f} {close_arrivals(records):9.1%}",
            flush=True,
        )


if __name__ == "__main__":
    main()
