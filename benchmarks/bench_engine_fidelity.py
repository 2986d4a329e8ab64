"""The calibrated engine against published figures (harness.sim.fidelity): TPOT at batch 1 / 8 / 32 /
64 / 128 and TTFT of 128 / 1,024 / 4,096-token prompts, simulator against reference, each within
+-20%. Runs in simulated time (well under a second); exits 1 when a point is out of bounds.

    .venv/bin/python benchmarks/bench_engine_fidelity.py
"""

from __future__ import annotations

import sys

from harness.sim.fidelity import TOLERANCE, fidelity


def main() -> int:
    points = fidelity()
    print("| figure | simulator | reference | error | source |")
    print("|---|---:|---:|---:|---|")
    for p in points:
        verdict = "" if p.holds else " **out of bounds**"
        print(
            f"| {p.figure} | {p.simulated_s * 1e3:.2f} ms | {p.reference_s * 1e3:.2f} ms | "
            f"{p.error:+.0%}{verdict} | {p.source} |"
        )
    missed = [p for p in points if not p.holds]
    print(f"\n{len(points) - len(missed)} of {len(points)} points within +-{TOLERANCE:.0%}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
