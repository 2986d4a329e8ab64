"""Cross-validation of the routing bench's two modes: does virtual time reproduce the live cluster?

The virtual mode's headline figures (64 calibrated pods, 20,000 unshrunk requests) cannot be run
live on this machine, so they are worth quoting only if virtual time gets the live bench right
where both can run. This script runs the live bench (a throw-away control plane, simulated vLLM
pods created through the API, the EPP behind a real Envoy, Envoy's own balancers) and then the
live run's twin in virtual time (``harness.cli.bench.virtual.replica``: the same engines, the very
same traces at the same rates, each router in its live counterpart's role), and compares the
ratios the bench reports: the EPP's TTFT p90 against each peer's, and its goodput against each
peer's, medians of the repeats. Each must agree within ``--tolerance`` (default ±15%, relative to
the live ratio); the script exits 1 when one does not.

The live simulators run at time scale 6 here (6 wall seconds per simulated second; the routing
bench's default is 3), the scale the live bench's capacity probe uses for the same reason: the run must
measure the routing, not this machine. On 2 cores at time scale 3 the live EPP's TTFT p90 ran 24-96%
above its twin's in the runs of 6 Dec 2026 (the pods' own TTFT as well, with no engine step late enough
to count as CPU lag; on 5 Dec's VM it agreed), while round robin and least request agreed; at time
scale 6 the same traces agree within 2% (10 repeats).

    .venv/bin/python benchmarks/bench_cross_validation.py                  # 4 pods, 3 x 600 requests at 0.9x
    .venv/bin/python benchmarks/bench_cross_validation.py --pods 8 --requests 800 --loads 0.8,0.9
    .venv/bin/python benchmarks/bench_cross_validation.py --time-scale 3   # the routing bench's own clock
    .venv/bin/python benchmarks/bench_cross_validation.py --with-oracle    # the engines' own check too
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from harness.cli.bench import report
from harness.cli.bench.runner import (
    CAPACITY_MIN_TIME_SCALE,
    DEFAULT_SIM,
    BenchConfig,
    BenchResult,
    default_workload,
    run_benchmark,
)
from harness.cli.bench.stats import RunResult
from harness.cli.bench.virtual.replica import LIVE_TO_VIRTUAL, replay_in_virtual_time
from harness.cli.command import interrupts_deferred, no_children_left, start_control_plane
from harness.cli.console import Column, print_table

PEERS = (report.ROUND_ROBIN, report.LEAST_REQUEST)


@dataclass(frozen=True)
class Agreement:
    figure: str
    load: float
    live: float
    virtual: float

    @property
    def difference(self) -> float:
        """The virtual ratio's departure from the live one, relative to the live one."""
        return self.virtual / self.live - 1.0


def median_of(result: BenchResult, policy: str, load: float, figure: str) -> float:
    runs = [r for r in result.runs if r.policy == policy and r.load == load]
    return statistics.median(value(r, figure) for r in runs)


def value(run: RunResult, figure: str) -> float:
    if figure == "ttft_p90":
        return run.ttft["p90"]
    if figure == "server_ttft_p90":
        return run.server_ttft["p90"]
    if figure == "path_overhead":
        return run.path_overhead
    return float(getattr(run, figure))


def agreements(live: BenchResult, twin: BenchResult) -> list[Agreement]:
    """EPP / peer for TTFT p90 and goodput at every load, in both modes."""
    out = []
    for load in live.config.loads:
        for peer in (p for p in PEERS if p in twin.policies):
            for figure, label in (("ttft_p90", "TTFT p90"), ("goodput_rps", "goodput")):
                ratios = [
                    median_of(result, report.EPP, load, figure) / median_of(result, peer, load, figure)
                    for result in (live, twin)
                ]
                out.append(Agreement(f"EPP / {peer}, {label}", load, ratios[0], ratios[1]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--requests", type=int, default=600, help="requests per trace (default 600)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loads", default="0.9", help="comma-separated loads (default 0.9)")
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--with-oracle",
        action="store_true",
        help="also run the oracle, live and twinned (a row of its own, no ratio): it reads the engines' "
        "state in the bench's process, so where it agrees and the EPP does not, the engines are not "
        "what departs",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=CAPACITY_MIN_TIME_SCALE,
        help=f"the live simulators' wall seconds per simulated second (default {CAPACITY_MIN_TIME_SCALE:g}, "
        f"the routing bench's {DEFAULT_SIM.time_scale:g}); a slower clock leaves the host more room, so a "
        "departure that shrinks with it is the host's",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="where both runs' reports go")
    args = parser.parse_args()
    loads = tuple(float(x) for x in args.loads.split(","))
    config = BenchConfig(
        pods=args.pods,
        loads=loads,
        repeats=args.repeats,
        requests=args.requests,
        policies=(report.EPP, *PEERS, *((report.ORACLE,) if args.with_oracle else ())),
        workload=default_workload(),
        sim=replace(DEFAULT_SIM, time_scale=args.time_scale),
        seed=args.seed,
    )
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    began = time.monotonic()
    plane = start_control_plane()
    try:
        live = run_benchmark(config, plane.access)
    finally:
        with interrupts_deferred():
            plane.stop()
    live_s = time.monotonic() - began
    twin = replay_in_virtual_time(live)
    print(
        f"live: {config.pods} pods, {config.repeats} x {config.requests} requests per load, capacity "
        f"{live.capacity_rps:.0f} requests per simulated second, {live_s:.0f} s; "
        f"virtual twin {twin.wall_s:.1f} s"
    )
    for result, stem in ((live, "cross-validation-live"), (twin, "cross-validation-virtual")):
        print(f"wrote {report.write(result, args.out, stem=stem)['markdown']}")
    rows = []
    for load in loads:
        for policy in live.policies:
            if policy in twin.policies:
                rows.append(
                    [f"{load:g}", f"{policy} (virtual: {LIVE_TO_VIRTUAL[policy]})"]
                    + [report.ms(median_of(r, policy, load, "ttft_p90")) for r in (live, twin)]
                    + [f"{median_of(r, policy, load, 'goodput_rps'):.0f}" for r in (live, twin)]
                    + [report.ms(median_of(live, policy, load, "server_ttft_p90"))]
                    + [
                        report.ms(median_of(live, policy, load, "path_overhead")),
                        f"{median_of(live, policy, load, 'lag'):.1%}",
                        report.ms_fine(median_of(live, policy, load, "behind")),
                    ]
                )
    print_table(
        "Per policy (medians of the repeats; simulated time; at the server: TTFT p90 as the pods saw it)",
        (
            Column("load"),
            Column("policy", "left"),
            Column("TTFT p90 live"),
            Column("virtual"),
            Column("goodput live"),
            Column("virtual"),
            Column("live at the server"),
            Column("live path"),
            Column("live CPU lag"),
            Column("live behind"),
        ),
        rows,
    )
    found = agreements(live, twin)
    print_table(
        f"Ratios, live against virtual (bound: within ±{args.tolerance:.0%} of the live ratio)",
        (
            Column("load"),
            Column("ratio", "left"),
            Column("live"),
            Column("virtual"),
            Column("difference"),
            Column("holds"),
        ),
        [
            [
                f"{a.load:g}",
                a.figure,
                f"{a.live:.2f}",
                f"{a.virtual:.2f}",
                f"{a.difference:+.0%}",
                "yes" if abs(a.difference) <= args.tolerance else "NO",
            ]
            for a in found
        ],
    )
    for note in live.notes + twin.notes:
        print(f"note: {note}")
    if not no_children_left():
        return 1
    missed = [a for a in found if abs(a.difference) > args.tolerance]
    print(f"{len(found) - len(missed)} of {len(found)} ratios agree within ±{args.tolerance:.0%}")
    return 1 if missed or not found else 0


if __name__ == "__main__":
    sys.exit(main())
