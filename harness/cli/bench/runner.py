"""One benchmark run: measure the pool's capacity, then replay the same traces through every policy.

Order of work, and why:
1. Start the pool (API objects, simulators) and every policy (their processes stay up throughout).
2. Capacity: a saturating burst routed to the pod with the fewest requests outstanding (as the
   virtual mode's probe); capacity is the completion rate over the middle 60% of completions (the
   start fills the pods and the end drains them). Loads are fractions of this measured rate, so
   "0.9" means 90% of what this pool, on this machine, serves when spread by load alone.
3. For each load and repeat, one trace (its own seed) is replayed through every policy, in a rotated
   order per repeat so slow drift of a shared machine does not always hit the same policy. Before
   each replay the simulators drain and reset to a cold start (no cached prefix, no adapter loaded).
4. Figures leave out the first ``warmup_fraction`` of each trace (10%): those requests meet empty
   queues and cold caches. Client-side figures drop them by trace index, and throughput and goodput
   count from the first kept request's arrival; the model servers' own TTFTs drop each pod's first
   10% of first tokens (they are not tied to a trace index).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from harness.cli.bench.environment import BenchPool, PoolSpec
from harness.cli.bench.loadgen import Outcome, Target, replay
from harness.cli.bench.policies import (
    ForeignEppPolicy,
    LeastOutstandingPolicy,
    PeerRouterPolicy,
    Policy,
    builtin_policies,
    epp_variant,
    foreign_epp_policy,
    peer_policies,
)
from harness.cli.bench.stats import RunResult, Slo, aggregate, summarize
from harness.cli.bench.workload import TraceRequest, WorkloadSpec, generate
from harness.cluster.controlplane import ClusterAccess
from harness.sim import SimConfig

DEFAULT_LOADS = (0.5, 0.8, 0.9, 1.0, 1.2)
HEADLINE_LOAD = 0.9
# The benchmark's simulated pod: a slice of an H100 serving an 8B model (constants in SimConfig).
# 8 running sequences and 48 KV blocks (768 tokens) so that KV can bind before the slots at high
# load (long requests get preempted), and 2 adapter slots for 4 adapters plus the base model.
# Time runs 3x slower than real: the request rate the routers see (and the tokens this machine
# must stream) stays within what 2 shared cores sustain, so latencies measure routing, not the host.
DEFAULT_SIM = SimConfig(
    model="meta-llama/Llama-3.1-8B-Instruct",
    lora_adapters=("lora-0", "lora-1", "lora-2", "lora-3"),
    max_loras=2,
    max_num_seqs=8,
    num_gpu_blocks=48,
    time_scale=3.0,
)
# ShareGPT-like lengths shrunk 16x (means ~10 prompt and ~21 output tokens) so that a run fits this
# machine: tokens, not requests, cost the client and the simulators CPU.
DEFAULT_LENGTH_SCALE = 1 / 16
CAPACITY_FRACTIONS = (0.2, 0.8)
# The probe runs at least this slow (wall seconds per simulated second): saturated pods emit tokens
# at their fastest, and this machine must keep up or the probe would measure its CPU instead.
CAPACITY_MIN_TIME_SCALE = 6.0


class Reporter(Protocol):
    """Told what the benchmark is doing (the CLI draws a progress bar from it)."""

    def phase(self, message: str) -> None: ...

    def planned(self, runs: int) -> None: ...

    def run_done(self, run: RunResult) -> None: ...


class _Silent:
    def phase(self, message: str) -> None:
        pass

    def planned(self, runs: int) -> None:
        pass

    def run_done(self, run: RunResult) -> None:
        pass


def default_workload(**changes: Any) -> WorkloadSpec:
    return replace(WorkloadSpec(length_scale=DEFAULT_LENGTH_SCALE, base_model=DEFAULT_SIM.model), **changes)


@dataclass(frozen=True)
class BenchConfig:
    pods: int = 8
    loads: tuple[float, ...] = DEFAULT_LOADS
    repeats: int = 3
    requests: int = 600  # per run: a warm steady state, not a cold start
    warmup_fraction: float = 0.1  # of each trace, left out of the figures
    policies: tuple[str, ...] = ()  # names to run; empty: every available one
    workload: WorkloadSpec = field(default_factory=default_workload)
    sim: SimConfig = DEFAULT_SIM
    slo: Slo = field(default_factory=Slo)
    capacity_requests: int = 300
    seed: int = 1
    namespace: str = "bench"
    epp_args: tuple[str, ...] = ()
    # Extra EPP configurations run as policies of their own (``policies.epp_variant``), for ablations.
    epp_variants: tuple[str, ...] = ()
    # Other EPPs as peers (``policies.foreign_epp_policy``): ``gie-vX.Y.Z`` or ``NAME=COMMAND``.
    epp_peers: tuple[str, ...] = ()
    # The workload's name (harness.cli.bench.workloads), which every ratio of the report names.
    workload_name: str = "sharegpt"
    mode: str = "live"  # or "virtual" (harness.cli.bench.virtual)

    @property
    def time_scale(self) -> float:
        return self.sim.time_scale


@dataclass
class BenchResult:
    config: BenchConfig
    capacity_rps: float = 0.0
    policies: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    runs: list[RunResult] = field(default_factory=list)
    wall_s: float = 0.0

    def aggregated(self) -> dict[tuple[str, float], dict[str, Any]]:
        groups: dict[tuple[str, float], list[RunResult]] = {}
        for run in self.runs:
            groups.setdefault((run.policy, run.load), []).append(run)
        return {key: aggregate(runs) for key, runs in groups.items()}


def select_policies(wanted: Sequence[str], epp_args: Sequence[str] = ()) -> tuple[list[Policy], list[str]]:
    """The policies to run (all available when ``wanted`` is empty, "none" for none) and notes on the
    ones skipped."""
    if tuple(wanted) == ("none",):
        return [], []
    candidates = builtin_policies(epp_args)
    peers, notes = peer_policies()
    candidates += peers
    if not wanted:
        return candidates, notes
    by_name = {p.name: p for p in candidates}
    chosen: list[Policy] = []
    notes = []
    for name in wanted:
        if name in by_name:
            chosen.append(by_name[name])
        elif name.split(":", 1)[0] in ("vllm-router", "sglang-router"):
            notes.append(
                f"{name}: not available (is the router installed? pip install 'inference-epp[peers]')"
            )
        else:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(by_name))}")
    return chosen, [n for n in notes if any(n.startswith(w.split(":", 1)[0]) for w in wanted)]


def run_benchmark(
    config: BenchConfig,
    access: ClusterAccess,
    *,
    reporter: Reporter | None = None,
) -> BenchResult:
    began = time.monotonic()
    report = reporter or _Silent()
    policies, notes = select_policies(config.policies, config.epp_args)
    policies += [epp_variant(v, config.epp_args) for v in config.epp_variants]
    policies += [foreign_epp_policy(spec) for spec in config.epp_peers]
    result = BenchResult(config, notes=list(notes))
    pool = BenchPool(access, config.namespace, PoolSpec(config.pods, config.sim), config.workload)
    started: list[Policy] = []
    with pool:
        try:
            for policy in policies:
                report.phase(f"starting {policy.name}")
                try:
                    policy.start(pool.view)
                except Exception as exc:
                    if not isinstance(policy, (PeerRouterPolicy, ForeignEppPolicy)):
                        raise  # the EPP, Envoy or the oracle failing is the benchmark failing
                    # A peer router or EPP is optional context: note it and go on without it.
                    first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    result.notes.append(f"{policy.name}: did not start ({first_line}); skipped")
                    continue
                started.append(policy)
            result.policies = [p.name for p in started]
            report.phase("measuring the pool's capacity (a saturating burst, least outstanding requests)")
            result.capacity_rps = measure_capacity(pool, config)
            report.phase(f"capacity: {result.capacity_rps:.1f} requests per simulated second")
            report.planned(len(config.loads) * config.repeats * len(started))
            for load_index, load in enumerate(config.loads):
                for repeat in range(config.repeats):
                    trace = generate(trace_spec(config, result.capacity_rps, load_index, repeat))
                    shift = repeat % max(1, len(started))
                    for policy in started[shift:] + started[:shift]:
                        run = replay_once(pool, policy, trace.requests, config, load, repeat)
                        result.runs.append(run)
                        report.run_done(run)
        finally:
            for policy in started:
                policy.stop()
    result.wall_s = time.monotonic() - began
    return result


def trace_spec(config: BenchConfig, capacity_rps: float, load_index: int, repeat: int) -> WorkloadSpec:
    """The trace of one (load, repeat): its own seed, at that load times the measured capacity.

    Shared with the virtual replay of a live run (``virtual.replica``), which must replay the very
    same requests at the very same times."""
    return replace(
        config.workload,
        requests=config.requests,
        rate=config.loads[load_index] * capacity_rps,
        seed=config.seed + 1000 * repeat + load_index,
    )


def replay_once(
    pool: BenchPool,
    policy: Policy,
    requests: Sequence[TraceRequest],
    config: BenchConfig,
    load: float,
    repeat: int,
) -> RunResult:
    pool.reset(config.time_scale)
    policy.begin_run()
    try:
        before = pool.counters()
        began = time.monotonic()
        outcomes = pool.run(replay(requests, policy.route, time_scale=config.time_scale))
        span = time.monotonic() - began
        after = pool.counters()
        server_ttfts = pool.server_ttfts(skip_fraction=config.warmup_fraction)
    finally:
        policy.end_run()
    measured = measured_part(requests, outcomes, span, config)
    pairs = list(zip(after, before, strict=True))
    queried = sum(a.prefix_queries - b.prefix_queries for a, b in pairs)
    hits = sum(a.prefix_hits - b.prefix_hits for a, b in pairs)
    return summarize(
        policy.name,
        load,
        repeat,
        measured.outcomes,
        time_scale=config.time_scale,
        span_wall_s=measured.span_wall_s,
        arrivals=measured.arrivals,
        per_pod=pool.served_per_pod(),
        slo=config.slo,
        late_s=sum(a.late_s - b.late_s for a, b in pairs),
        behind_s=sum(a.behind_s - b.behind_s for a, b in pairs),
        busy_s=sum(a.busy_s - b.busy_s for a, b in pairs),
        prefix_hit_rate=hits / queried if queried else math.nan,
        server_ttft_mean=statistics.fmean(server_ttfts) if server_ttfts else math.nan,
        server_ttfts=server_ttfts,
    )


@dataclass(frozen=True)
class Measured:
    """The part of a run the figures count: the warm-up left out."""

    outcomes: list[Outcome]
    span_wall_s: float  # from the first counted request's arrival to the end of the run
    arrivals: list[float]  # the counted requests' arrival offsets, simulated seconds (goodput's rate)


def measured_part(
    requests: Sequence[TraceRequest], outcomes: Sequence[Outcome], span_wall_s: float, config: BenchConfig
) -> Measured:
    """The outcomes the figures count (the warm-up left out), the wall time they span (throughput
    divides by it) and their requests' arrivals."""
    warm = warm_count(len(requests), config.warmup_fraction)
    arrivals = [r.at for r in requests[warm:]]
    if not warm:
        return Measured(list(outcomes), span_wall_s, arrivals)
    first = requests[warm]
    kept = [o for o in outcomes if o.index >= first.index]
    return Measured(kept, max(1e-9, span_wall_s - first.at * config.time_scale), arrivals)


def warm_count(requests: int, fraction: float) -> int:
    """How many of a trace's first requests are left out (never all of them)."""
    return min(max(0, requests - 1), math.ceil(requests * fraction))  # as the virtual mode


def measure_capacity(pool: BenchPool, config: BenchConfig) -> float:
    """Requests per simulated second the pool completes when saturated (see the module docstring)."""
    probe = LeastOutstandingPolicy("capacity-probe")
    probe.start(pool.view)
    burst = generate(
        replace(config.workload, requests=config.capacity_requests, rate=1e9, seed=config.seed - 1)
    )
    # Slower than the runs, so that the burst's token rate cannot make this machine the bottleneck.
    scale = max(config.time_scale, CAPACITY_MIN_TIME_SCALE)
    pool.reset(scale)
    probe.begin_run()
    done: list[float] = []

    def finished(request: TraceRequest, target: Target, outcome: Outcome) -> None:
        probe.finished(target)
        if outcome.ok:
            done.append(asyncio.get_running_loop().time())

    try:
        outcomes = pool.run(replay(burst.requests, probe.route, time_scale=scale, on_done=finished))
    finally:
        probe.stop()
    failed = sum(1 for o in outcomes if not o.ok)
    if failed or len(done) < 10:
        raise RuntimeError(f"capacity probe: {failed} of {len(outcomes)} requests failed")
    done.sort()
    lo, hi = (round(f * (len(done) - 1)) for f in CAPACITY_FRACTIONS)
    return (hi - lo) / ((done[hi] - done[lo]) / scale)
