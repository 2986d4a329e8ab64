"""What a benchmark run leaves behind: a Markdown table, a JSON file, PNG plots, and the ratios.

The ratios are the point of the benchmark (issue targets, at the headline load of 0.9x capacity):
EPP TTFT p90 over round robin's, over the best peer router's, over the oracle's; EPP goodput against
every peer's. Each figure is the median over repeats; tables show the spread (min-max) of TTFT p90.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from harness.cli.bench.policies import epp_peer_name
from harness.cli.bench.runner import HEADLINE_LOAD, BenchResult
from harness.cli.bench.stats import Spread
from harness.cli.console import Column

EPP = "epp"
ROUND_ROBIN = "envoy-round-robin"
LEAST_REQUEST = "envoy-least-request"
ORACLE = "oracle"
PEER_PREFIXES = ("vllm-router:", "sglang-router:")
CACHE_AWARE = ("vllm-router:cache_aware", "sglang-router:cache_aware")

COLUMNS = (
    Column("load"),
    Column("policy", "left"),
    Column("TTFT p50"),
    Column("TTFT p90 (min-max)"),
    Column("TTFT p99"),
    Column("server TTFT p90"),
    Column("ITL p50"),
    Column("ITL p90"),
    Column("ITL p99"),
    Column("E2E p50"),
    Column("E2E p90"),
    Column("E2E p99"),
    Column("req/s"),
    Column("tok/s"),
    Column("goodput"),
    Column("shed"),
    Column("errors"),
    Column("imbalance"),
    Column("prefix hits"),
    Column("path"),
    Column("CPU lag"),
    Column("behind"),
)


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"


def ms_fine(value: float) -> str:
    """Seconds as milliseconds with one decimal: for figures that matter well below a millisecond."""
    return "-" if math.isnan(value) else f"{value * 1000:.1f} ms"


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}%"


def _num(value: float, spec: str = ".1f") -> str:
    return "-" if math.isnan(value) else format(value, spec)


def rows(result: BenchResult, loads: Sequence[float] | None = None) -> list[list[str]]:
    table = result.aggregated()
    out = []
    for load in loads if loads is not None else result.config.loads:
        for policy in result.policies:
            agg = table.get((policy, load))
            if agg is None:
                continue
            p90: Spread = agg["ttft_p90"]
            out.append(
                [
                    f"{load:g}",
                    policy,
                    ms(agg["ttft_p50"].median),
                    f"{ms(p90.median)} ({ms(p90.low)}-{ms(p90.high)})",
                    ms(agg["ttft_p99"].median),
                    ms(agg["server_ttft_p90"].median),
                    ms(agg["itl_p50"].median),
                    ms(agg["itl_p90"].median),
                    ms(agg["itl_p99"].median),
                    ms(agg["e2e_p50"].median),
                    ms(agg["e2e_p90"].median),
                    ms(agg["e2e_p99"].median),
                    _num(agg["throughput_rps"].median),
                    _num(agg["output_tps"].median, ".0f"),
                    _num(agg["goodput_rps"].median),
                    _pct(agg["shed_rate"].median),
                    _pct(agg["error_rate"].median),
                    _num(agg["imbalance"].median, ".2f"),
                    _pct(agg["prefix_hit_rate"].median),
                    ms(agg["path_overhead"].median),
                    _pct(agg["lag"].median),
                    ms_fine(agg["behind"].median),
                ]
            )
    return out


@dataclass(frozen=True)
class Ratio:
    name: str
    value: float  # EPP's figure over the other's (for goodput: EPP's over the other's)
    against: str
    target: str  # "<= 0.5", ">= 1.0": `_ratio` writes it from the comparison and `bound`
    holds: bool | None  # None when the other policy did not run
    workload: str = ""  # the workload it was measured on (harness.cli.bench.workloads)
    bound: float = math.nan

    def line(self) -> str:
        where = f" on the {self.workload} workload" if self.workload else ""
        if self.holds is None:
            return f"{self.name}{where}: n/a ({self.against} did not run)"
        verdict = "holds" if self.holds else "MISSED"
        # Two decimals, or three where two would round onto the bound (0.997 is not "1.00 ... MISSED").
        value = f"{self.value:.3f}" if abs(self.value - self.bound) < 0.005 else f"{self.value:.2f}"
        return f"{self.name}{where}: {value} against {self.against} (target {self.target}: {verdict})"


# Virtual-mode policy names (harness.cli.bench.virtual.routers), kept here as plain strings.
V_ROUND_ROBIN = "round-robin"
V_LEAST_OUTSTANDING = "least-outstanding"
V_UPSTREAM_DEFAULT = "upstream-v1.5-default"


def ratios(result: BenchResult, load: float = HEADLINE_LOAD) -> list[Ratio]:
    """The issue's targets at ``load``, each labelled with the workload the run measured."""
    table = result.aggregated()
    workload = result.config.workload_name

    def p90(policy: str) -> float | None:
        agg = table.get((policy, load))
        return None if agg is None else float(agg["ttft_p90"].median)

    def goodput(policy: str) -> float | None:
        agg = table.get((policy, load))
        return None if agg is None else float(agg["goodput_rps"].median)

    epp = p90(EPP)
    if epp is None:
        return []
    out: list[Ratio] = []

    def add(name: str, mine: float, other: float | None, against: str, op: str, bound: float) -> None:
        out.append(replace(_ratio(name, mine, other, against, op, bound), workload=workload))

    if result.config.mode == "virtual":
        for name, policy, bound in (
            ("EPP / round robin, TTFT p90", V_ROUND_ROBIN, 0.5),
            ("EPP / least outstanding, TTFT p90", V_LEAST_OUTSTANDING, 0.8),
            ("EPP / upstream v1.5 default profile, TTFT p90", V_UPSTREAM_DEFAULT, 1.0),
            ("EPP / oracle, TTFT p90", ORACLE, 1.2),
        ):
            add(name, epp, p90(policy), policy, AT_MOST, bound)
        epp_good = goodput(EPP)
        # The EPP's own variants (``epp[last-routed]``, ``epp[filter-tree]``) are not its peers.
        peer_good = {p: v for p in result.policies if not p.startswith(EPP) and (v := goodput(p)) is not None}
        if epp_good is not None and peer_good:
            best = max(peer_good, key=lambda p: peer_good[p])
            add("EPP / best peer, goodput", epp_good, peer_good[best], best, AT_LEAST, 1.0)
        return out
    add("EPP / round robin, TTFT p90", epp, p90(ROUND_ROBIN), ROUND_ROBIN, AT_MOST, 0.5)
    peers = [p for p in result.policies if p.startswith(PEER_PREFIXES)]
    peer_p90 = {p: v for p in peers if (v := p90(p)) is not None}
    if peer_p90:
        best = min(peer_p90, key=lambda p: peer_p90[p])
        add("EPP / best peer, TTFT p90", epp, peer_p90[best], best, AT_MOST, 1.0)
    else:
        add("EPP / best peer, TTFT p90", epp, None, "the peer routers", AT_MOST, 1.0)
    add(
        "EPP / Envoy least-request, TTFT p90",
        epp,
        p90(LEAST_REQUEST),
        LEAST_REQUEST,
        AT_MOST,
        1.0,
    )
    add("EPP / oracle, TTFT p90", epp, p90(ORACLE), ORACLE, AT_MOST, 1.2)
    epp_good = goodput(EPP)
    # Today's other EPPs (`--epp-peer`): the EPP should be at least as good as each.
    for peer in (epp_peer_name(spec) for spec in result.config.epp_peers):
        add(f"EPP / {peer}, TTFT p90", epp, p90(peer), peer, AT_MOST, 1.0)
        if epp_good is not None:
            add(f"EPP / {peer}, goodput", epp_good, goodput(peer), peer, AT_LEAST, 1.0)
    peer_good = {p: v for p in peers if (v := goodput(p)) is not None}
    if epp_good is not None and peer_good:
        best = max(peer_good, key=lambda p: peer_good[p])
        add("EPP / best peer, goodput", epp_good, peer_good[best], best, AT_LEAST, 1.0)
    cache_aware = {p: v for p in CACHE_AWARE if (v := p90(p)) is not None}
    if cache_aware:
        best = min(cache_aware, key=lambda p: cache_aware[p])
        add(
            "EPP / best cache-aware peer, TTFT p90",
            epp,
            cache_aware[best],
            best,
            AT_MOST,
            1.0,
        )
    return out


AT_MOST = "<="
AT_LEAST = ">="


def _ratio(name: str, mine: float, other: float | None, against: str, op: str, bound: float) -> Ratio:
    """mine / other against the target ``op bound`` (`AT_MOST` or `AT_LEAST`)."""
    target = f"{op} {bound:.1f}"
    if other is None or math.isnan(other) or other <= 0 or math.isnan(mine):
        return Ratio(name, math.nan, against, target, None, bound=bound)
    value = mine / other
    holds = value <= bound if op == AT_MOST else value >= bound
    return Ratio(name, value, against, target, holds, bound=bound)


def describe(result: BenchResult) -> list[str]:
    c = result.config
    w, s = c.workload, c.sim
    clock = "virtual time (discrete events)" if c.mode == "virtual" else f"time scale {s.time_scale:g}"
    return [
        f"{c.pods} simulated pods: {s.model}, max_num_seqs {s.max_num_seqs}, {s.num_gpu_blocks} KV blocks of "
        f"{s.block_size} tokens, {s.max_loras} LoRA slots for {len(s.lora_adapters)} adapters, {clock}",
        f"workload: {c.workload_name}, {w.arrival} arrivals, lengths x{w.length_scale:g}, "
        f"adapters Zipf s={w.zipf_s:g} "
        f"({w.base_share:.0%} base model), criticality "
        + ", ".join(f"{name} {share:.0%}" for name, share in w.criticality_mix),
        f"capacity measured: {result.capacity_rps:.1f} requests per simulated second; loads "
        + ", ".join(f"{x:g}" for x in c.loads)
        + f"; {c.repeats} repeats of {c.requests} requests; SLO TTFT <= {ms(c.slo.ttft_s)}, "
        f"mean ITL <= {ms(c.slo.itl_s)}",
        f"all times in simulated seconds; the run took {result.wall_s:.0f} s",
    ]


def by_load_table(result: BenchResult, figure: str = "ttft_p90") -> list[str]:
    """Markdown lines: one row per policy, one column per load, the median of ``figure``."""
    table = result.aggregated()
    loads = result.config.loads
    lines = ["| policy | " + " | ".join(f"{load:g}" for load in loads) + " |"]
    lines.append("|---|" + "---:|" * len(loads))
    for policy in result.policies:
        cells = [
            ms(table[(policy, load)][figure].median) if (policy, load) in table else "-" for load in loads
        ]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return lines


def by_priority_table(result: BenchResult) -> list[str]:
    """Markdown lines: TTFT p90 and shed share per objective priority, one row per load and policy
    (medians of repeats); none when no run mixed priorities (workload `mixed-priority`)."""
    priorities = sorted({p for run in result.runs for p in run.by_priority}, key=int, reverse=True)
    if not priorities:
        return []
    header = "| load | policy | " + " | ".join(f"priority {p}: TTFT p90, shed" for p in priorities) + " |"
    lines = [header, "|---:|---|" + "---:|" * len(priorities)]
    for load in result.config.loads:
        for policy in result.policies:
            runs = [r for r in result.runs if r.policy == policy and r.load == load and r.by_priority]
            if not runs:
                continue
            cells = []
            for p in priorities:
                ttft = statistics.median(r.by_priority.get(p, {}).get("ttft_p90", math.nan) for r in runs)
                shed = statistics.median(r.by_priority.get(p, {}).get("shed_rate", math.nan) for r in runs)
                cells.append(f"{ms(ttft)}, {_pct(shed)}")
            lines.append(f"| {load:g} | {policy} | " + " | ".join(cells) + " |")
    return lines


def markdown(result: BenchResult) -> str:
    lines = ["# Routing benchmark", ""]
    lines += [f"- {line}" for line in describe(result)]
    lines.append("")
    if len(result.config.loads) > 1:
        lines.append("TTFT p90 (median of repeats) by load:")
        lines.append("")
        lines += by_load_table(result)
        lines.append("")
    header = [c.header for c in COLUMNS]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---:" if c.justify == "right" else "---" for c in COLUMNS) + "|")
    for row in rows(result):
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    priorities = by_priority_table(result)
    if priorities:
        lines.append("By objective priority (negative: sheddable; medians of repeats):")
        lines.append("")
        lines += priorities
        lines.append("")
    found = ratios(result)
    if found:
        lines.append(f"Ratios at {HEADLINE_LOAD:g}x capacity (median of repeats):")
        lines.append("")
        lines += [f"- {r.line()}" for r in found]
        lines.append("")
    if result.notes:
        lines.append("Notes:")
        lines.append("")
        lines += [f"- {note}" for note in result.notes]
        lines.append("")
    return "\n".join(lines)


def to_json(result: BenchResult) -> dict[str, Any]:
    c = result.config
    aggregated = [
        {"policy": policy, "load": load, **{name: s.to_json() for name, s in agg.items()}}
        for (policy, load), agg in sorted(result.aggregated().items())
    ]
    return {
        "config": {
            "pods": c.pods,
            "loads": list(c.loads),
            "repeats": c.repeats,
            "requests": c.requests,
            "seed": c.seed,
            "slo": asdict(c.slo),
            "sim": asdict(c.sim),
            "workload": asdict(c.workload),
            "epp_args": list(c.epp_args),
            "workload_name": c.workload_name,
            "mode": c.mode,
        },
        "capacity_rps": result.capacity_rps,
        "policies": result.policies,
        "notes": result.notes,
        "wall_s": result.wall_s,
        "ratios": [asdict(r) for r in ratios(result)],
        "aggregated": aggregated,
        "runs": [r.to_json() for r in result.runs],
    }


def plot(result: BenchResult, path: Path) -> None:
    """TTFT p90 and goodput against load, one line per policy, min-max bars over repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = result.aggregated()
    fig, (ttft_ax, good_ax) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=80)
    c = result.config
    fig.suptitle(f"{c.workload_name} workload, {c.pods} pods, {c.mode} mode", fontsize=10)
    for policy in result.policies:
        loads = [load for load in result.config.loads if (policy, load) in table]
        if not loads:
            continue
        style = {"linewidth": 2.6, "color": "black"} if policy == EPP else {"linewidth": 1.2}
        for ax, name, factor in ((ttft_ax, "ttft_p90", 1000.0), (good_ax, "goodput_rps", 1.0)):
            spreads = [table[(policy, load)][name] for load in loads]
            medians = [s.median * factor for s in spreads]
            errors = [
                [max(0.0, (s.median - s.low) * factor) for s in spreads],
                [max(0.0, (s.high - s.median) * factor) for s in spreads],
            ]
            ax.errorbar(
                loads, medians, yerr=errors, marker="o", markersize=3, capsize=2, label=policy, **style
            )
    ttft_ax.set_yscale("log")
    ttft_ax.set_title("TTFT p90 (simulated ms, log)")
    good_ax.set_title("goodput (requests/s within the SLO)")
    for ax in (ttft_ax, good_ax):
        ax.set_xlabel("load (fraction of measured capacity)")
        ax.grid(True, alpha=0.3)
    good_ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(result: BenchResult, out_dir: Path, stem: str = "routing") -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "markdown": out_dir / f"{stem}.md",
        "json": out_dir / f"{stem}.json",
        "plot": out_dir / f"{stem}.png",
    }
    paths["markdown"].write_text(markdown(result))
    paths["json"].write_text(json.dumps(to_json(result), indent=1, allow_nan=True))
    plot(result, paths["plot"])
    return paths
