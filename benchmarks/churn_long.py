"""The churn machine's long profile: many seeds, thousands of pods, the oracle after every step.

Starts its own control plane (never the shared one), then runs `harness.stress.churn.ChurnMachine` once per
seed, each seed until it has created at least `--pods` pods: hypothesis runs of `--examples`
examples of `--steps` steps (each example a fresh namespace and a fresh EPP), seeded from the seed,
until the pod count is reached. After every step the EPP is settled and its datastore compared with
the oracle. Prints per seed and in total: steps, checks, pods created, IP changes,
models (and claims made in the same creation second), EPP restarts, mismatches, wall time. A
mismatch is printed with hypothesis's list of the steps that led to it (not shrunk).

Pods are forged by default (stand-ins, status written by the test, see `harness/stress/churn.py`), whose
check is strict (the first verdict after settling); `--pod-kind agent` runs pods the node agent runs
instead (a FULL plane; the check polls the oracle after settling). Both cost about 0.15 s per step
on two shared cores, ~4 minutes per 300 pods.

    .venv/bin/python benchmarks/churn_long.py --seeds 20 --pods 300 \
        [--pod-kind agent] [--steps 100] [--examples 10] [--refresh-interval 0.5]
"""

from __future__ import annotations

import argparse
import logging
import time

from harness.cluster.controlplane import FULL, MINIMAL, ControlPlane
from harness.stress import churn


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--pods", type=int, default=300, help="pods to create per seed, at least")
    parser.add_argument("--steps", type=int, default=100, help="steps per example")
    parser.add_argument("--examples", type=int, default=10, help="examples per hypothesis run")
    parser.add_argument("--refresh-interval", type=float, default=0.5, help="the EPP's scrape interval, s")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--pod-kind", choices=[k.value for k in churn.PodKind], default="forged")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    kind = churn.PodKind(args.pod_kind)
    settings = churn.ChurnSettings(pod_kind=kind, refresh_interval=args.refresh_interval)
    total = churn.ChurnStats()
    failed_seeds: list[int] = []
    started = time.monotonic()
    components = MINIMAL if kind is churn.PodKind.FORGED else FULL
    with ControlPlane(components=components) as plane, plane.api_client() as api:
        print(f"churn, long profile: {args.seeds} seeds x >= {args.pods} pods ({kind.value} pods), "
              f"{args.steps} steps per example", flush=True)  # fmt: skip
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            stats = churn.ChurnStats()
            seed_started = time.monotonic()
            batch = 0
            try:
                while stats.pods_created < args.pods:
                    churn.run(api, plane.kubeconfig_path, f"churn-{seed}-{batch}", settings,
                              examples=args.examples, steps=args.steps, seed=seed * 1000 + batch,
                              shrink=False, stats=stats)  # fmt: skip
                    batch += 1
            except Exception as exc:  # a mismatch or a step that failed: report it, go on
                failed_seeds.append(seed)
                if not stats.mismatches:
                    stats.mismatches.append(f"{type(exc).__name__}: {exc}")
                print(f"seed {seed}: FAILED: {exc}", flush=True)
            print(f"seed {seed}: {churn.summary(stats, time.monotonic() - seed_started)}", flush=True)
            _add(total, stats)
    print(f"total: seeds={args.seeds} {churn.summary(total, time.monotonic() - started)}")
    print("steps by rule: " + ", ".join(f"{k}={v}" for k, v in sorted(total.step_counts.items())))
    if failed_seeds:
        print(f"FAILED seeds: {failed_seeds}")
        for mismatch in total.mismatches:
            print(f"  {mismatch}")
        raise SystemExit(1)


def _add(total: churn.ChurnStats, stats: churn.ChurnStats) -> None:
    for name in ("examples", "steps", "checks", "pods_created", "ip_changes", "epp_restarts",
                 "models_created", "same_second_claims"):  # fmt: skip
        setattr(total, name, getattr(total, name) + getattr(stats, name))
    total.mismatches += stats.mismatches
    for step, count in stats.step_counts.items():
        total.step_counts[step] = total.step_counts.get(step, 0) + count


if __name__ == "__main__":
    main()
