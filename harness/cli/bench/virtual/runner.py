"""``harness bench routing --virtual``: every policy against N calibrated engines in virtual time.

Order of work:
1. The workload (``harness.cli.bench.workloads``) and the calibrated engine (``h100_llama_8b``, with
   the workload's engine settings, e.g. 4 LoRA slots).
2. Capacity: a saturating burst (6 x ``max_num_seqs`` requests per engine, all at once) on
   ``probe_pods`` engines routed by least outstanding; capacity is their completion rate over the
   middle 60% of completions, times ``pods / probe_pods`` (the engines are identical, so least
   outstanding over N of them serves N times one group's rate).
3. For each load and repeat one trace of ``requests`` requests at ``load x capacity`` (its own seed),
   replayed through every policy on fresh (cold) engines. Figures leave out the first ``warmup``
   share of the trace's requests, which meet an empty cluster.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from harness.cli.bench.runner import BenchConfig, BenchResult, Reporter
from harness.cli.bench.stats import PERCENTILES, RunResult, Slo, goodput
from harness.cli.bench.virtual.cluster import ClusterConfig, Record, VirtualCluster
from harness.cli.bench.virtual.routers import ALL, LEAST_OUTSTANDING, make_router
from harness.cli.bench.workload import generate
from harness.cli.bench.workloads import SHAREGPT, named_workload
from harness.sim import SimConfig, h100_llama_8b

CAPACITY_FRACTIONS = (0.2, 0.8)
BURST_PER_SLOT = 6
# Goodput SLOs for unshrunk requests on the calibrated engine, fixed before any run: about ten times
# the unloaded TTFT of a long ShareGPT prompt (1,024 tokens: 23 ms) and of a decode step at full batch.
VIRTUAL_SLO = Slo(ttft_s=0.3, itl_s=0.05)


@dataclass(frozen=True)
class VirtualConfig:
    workload: str = SHAREGPT
    pods: int = 64
    requests: int = 20_000
    loads: tuple[float, ...] = (0.9,)
    repeats: int = 1
    policies: tuple[str, ...] = ALL
    seed: int = 1
    slo: Slo = VIRTUAL_SLO
    warmup: float = 0.1
    probe_pods: int = 4
    sim_changes: dict[str, Any] = field(default_factory=dict)


def virtual_sim(config: VirtualConfig) -> SimConfig:
    named = named_workload(config.workload, h100_llama_8b().model)
    return h100_llama_8b(time_scale=0.0, **{**named.sim_changes, **config.sim_changes})


def run_virtual(config: VirtualConfig, reporter: Reporter | None = None) -> BenchResult:
    began = time.monotonic()
    cpu_began = time.process_time()
    sim = virtual_sim(config)
    named = named_workload(config.workload, sim.model)
    bench = BenchConfig(
        pods=config.pods,
        loads=config.loads,
        repeats=config.repeats,
        requests=config.requests,
        policies=config.policies,
        workload=named.spec,
        sim=sim,
        slo=config.slo,
        seed=config.seed,
        workload_name=config.workload,
        mode="virtual",
    )
    result = BenchResult(bench, policies=list(config.policies))
    if reporter is not None:
        reporter.phase(f"measuring capacity on {min(config.probe_pods, config.pods)} engines")
    result.capacity_rps = measure_capacity(config, sim)
    if reporter is not None:
        reporter.phase(f"capacity: {result.capacity_rps:.0f} requests per simulated second")
        reporter.planned(len(config.loads) * config.repeats * len(config.policies))
    for load_index, load in enumerate(config.loads):
        for repeat in range(config.repeats):
            spec = replace(
                named.spec,
                requests=config.requests,
                rate=load * result.capacity_rps,
                seed=config.seed + 1000 * repeat + load_index,
            )
            trace = generate(spec)
            for policy in config.policies:
                cluster = VirtualCluster(ClusterConfig(config.pods, sim, seed=config.seed + repeat))
                started = time.monotonic()
                records = cluster.run(trace.requests, make_router(policy, config.seed + repeat))
                run = summarize(policy, load, repeat, records, cluster, config, time.monotonic() - started)
                result.runs.append(run)
                if reporter is not None:
                    reporter.run_done(run)
    result.wall_s = time.monotonic() - began
    # On a shared machine the wall time says more about the neighbours than about the benchmark.
    result.notes.append(
        f"CPU time {time.process_time() - cpu_began:.0f} s, wall {result.wall_s:.0f} s "
        f"(load average {os.getloadavg()[0]:.1f} at the end)"
    )
    return result


def measure_capacity(config: VirtualConfig, sim: SimConfig) -> float:
    probe = min(config.probe_pods, config.pods)
    named = named_workload(config.workload, sim.model)
    burst = generate(
        replace(
            named.spec, requests=BURST_PER_SLOT * sim.max_num_seqs * probe, rate=1e9, seed=config.seed - 1
        )
    )
    cluster = VirtualCluster(ClusterConfig(probe, sim, seed=config.seed))
    records = cluster.run(burst.requests, make_router(LEAST_OUTSTANDING, config.seed))
    done = sorted(r.finished for r in records if r.finished is not None)
    if len(done) < 10:
        raise RuntimeError(f"capacity probe: only {len(done)} of {len(records)} requests finished")
    lo, hi = (round(f * (len(done) - 1)) for f in CAPACITY_FRACTIONS)
    return (hi - lo) / (done[hi] - done[lo]) * config.pods / probe


def summarize(
    policy: str,
    load: float,
    repeat: int,
    records: Sequence[Record],
    cluster: VirtualCluster,
    config: VirtualConfig,
    wall_s: float,
) -> RunResult:
    """The figures of one run over its warm part (the first ``warmup`` share of requests left out)."""
    warm = records[math.ceil(config.warmup * len(records)) :]
    ok = [r for r in warm if r.finished is not None and r.first_token is not None and r.run is not None]
    shed = sum(1 for r in warm if r.shed)
    ttfts = [r.first_token - r.request.at for r in ok]  # type: ignore[operator]
    e2es = [r.finished - r.request.at for r in ok]  # type: ignore[operator]
    gaps = [r.run.timings().inter_token_s for r in ok]  # type: ignore[union-attr]
    slo = config.slo
    good = 0
    for ttft, g in zip(ttfts, gaps, strict=True):
        itl = (sum(g) / len(g)) if g else 0.0
        if ttft <= slo.ttft_s and itl <= slo.itl_s:
            good += 1
    start = warm[0].request.at if warm else 0.0
    end = max((r.finished for r in ok if r.finished is not None), default=start)
    span = max(end - start, 1e-9)
    per_pod = [0] * len(cluster.pods)
    for r in warm:
        if r.pod >= 0:
            per_pod[r.pod] += 1
    mean = statistics.mean(per_pod) if per_pod else 0.0
    queried = sum(e.counters().prefix_queries for e in cluster.engines)
    hits = sum(e.counters().prefix_hits for e in cluster.engines)
    flat = np.fromiter((x for g in gaps for x in g), dtype=float)
    ttft_p = _percentiles(ttfts)
    return RunResult(
        policy=policy,
        load=load,
        repeat=repeat,
        requests=len(warm),
        ok=len(ok),
        shed=shed,
        errors=len(warm) - len(ok) - shed,
        ttft=ttft_p,
        itl=_percentiles(flat),
        e2e=_percentiles(e2es),
        throughput_rps=len(ok) / span,
        output_tps=sum(r.request.max_tokens for r in ok) / span,
        goodput_rps=goodput(good, [r.request.at for r in warm]),
        imbalance=(max(per_pod) / mean) if mean > 0 else math.nan,
        per_pod=per_pod,
        wall_s=wall_s,
        ttft_mean=statistics.mean(ttfts) if ttfts else math.nan,
        server_ttft_mean=statistics.mean(ttfts) if ttfts else math.nan,
        server_ttft=ttft_p,  # no path in front of the engines in virtual time
        prefix_hit_rate=hits / queried if queried else math.nan,
        by_priority=_by_priority(ok, ttfts, warm),
    )


def _percentiles(values: Any) -> dict[str, float]:
    if len(values) == 0:
        return {f"p{q}": math.nan for q in PERCENTILES}
    # Nearest rank, as stats.percentile: the smallest value with at least q% at or below it.
    ordered = np.sort(np.asarray(values, dtype=float))
    return {f"p{q}": float(ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]) for q in PERCENTILES}


def _by_priority(
    ok: Sequence[Record], ttfts: Sequence[float], warm: Sequence[Record]
) -> dict[str, dict[str, float]]:
    """TTFT p90 and shed share per priority (only when the trace mixes priorities)."""
    priorities = sorted({r.request.priority for r in warm})
    if len(priorities) < 2:
        return {}
    out: dict[str, dict[str, float]] = {}
    for p in priorities:
        mine = [t for r, t in zip(ok, ttfts, strict=True) if r.request.priority == p]
        total = sum(1 for r in warm if r.request.priority == p)
        shed = sum(1 for r in warm if r.request.priority == p and r.shed)
        out[str(p)] = {"ttft_p90": _percentiles(mine)["p90"], "shed_rate": shed / max(1, total)}
    return out
