"""From what the client saw to the figures of one run, and from runs to the figures of a policy at a load.

All latencies and rates are in simulated seconds (wall seconds divided by the time scale), so they
read as an 8B model on an H100 would serve them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.cli.bench.loadgen import Outcome

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    """Goodput counts requests whose TTFT and mean inter-token latency are both within these.

    Defaults for the benchmark's shrunk requests (~10-token prompts, unloaded TTFT ~10 ms and ITL
    ~6 ms): about ten times the unloaded figures, so queueing shows up as lost goodput.
    """

    ttft_s: float = 0.1
    itl_s: float = 0.05


@dataclass(frozen=True)
class RunResult:
    policy: str
    load: float
    repeat: int
    requests: int
    ok: int
    shed: int
    errors: int
    ttft: dict[str, float]  # "p50"/"p90"/"p99", simulated seconds
    itl: dict[str, float]
    e2e: dict[str, float]
    throughput_rps: float  # successful requests per simulated second
    output_tps: float  # output tokens per simulated second
    goodput_rps: float  # requests within the SLO per simulated second of offered traffic (`goodput`)
    imbalance: float  # busiest pod's requests / mean requests per pod (1.0 = even)
    per_pod: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    # Share of the run's simulated time the simulators' steps ran late because the host was busy
    # (averaged over pods). Above a few percent, latencies include this machine's CPU contention.
    lag: float = 0.0
    # Mean simulated seconds the simulators' step loops ran behind the wall clock while catching up,
    # below what counts as lag (`Counters.behind_s`): what the EPP's scrapes, the proxy and the client
    # see late. Well under a step on a host with room; a large share of one means the host shapes
    # the figures (the policies that read the pods' state the most, the most).
    behind: float = 0.0
    # Mean TTFT as the client saw it and as the model servers saw it (arrival to first token): the
    # difference is what the path in between (proxy, router) added.
    ttft_mean: float = math.nan
    server_ttft_mean: float = math.nan
    # TTFT percentiles as the model servers measured them (arrival to first token): the routing's
    # effect without the path in front of the servers.
    server_ttft: dict[str, float] = field(default_factory=dict)
    # Share of prompt tokens the model servers found in their prefix caches.
    prefix_hit_rate: float = math.nan
    # Per objective priority ("1", "0", "-1"): TTFT p90 and shed share, when a trace mixes priorities.
    by_priority: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def path_overhead(self) -> float:
        return self.ttft_mean - self.server_ttft_mean

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (what a latency report means by p90); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def goodput(good: int, arrivals: Sequence[float]) -> float:
    """Requests within the SLO per second: the share of the counted requests that met it times the
    rate they were offered at (from their arrival times, simulated seconds, in trace order).

    Not divided by the run's span, which ends when the last request finishes: a trace of a few
    seconds at 64 pods drains for as long again, and that tail (one long decode) would rank policies
    that all met the SLO for every request. Here those tie at the offered rate, and a policy only
    gains goodput by meeting the SLO more often. NaN for fewer than two arrivals.
    """
    if len(arrivals) < 2 or arrivals[-1] <= arrivals[0]:
        return math.nan
    offered = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    return good / len(arrivals) * offered


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


def summarize(
    policy: str,
    load: float,
    repeat: int,
    outcomes: Sequence[Outcome],
    *,
    time_scale: float,
    span_wall_s: float,
    arrivals: Sequence[float],
    per_pod: Sequence[int],
    slo: Slo,
    late_s: float = 0.0,
    behind_s: float = 0.0,
    busy_s: float = 0.0,
    server_ttft_mean: float = math.nan,
    server_ttfts: Sequence[float] = (),
    prefix_hit_rate: float = math.nan,
) -> RunResult:
    scale = time_scale if time_scale > 0 else 1.0
    ok = [o for o in outcomes if o.ok]
    shed = sum(1 for o in outcomes if o.status == 429)
    errors = len(outcomes) - len(ok) - shed
    ttfts = [o.ttft / scale for o in ok if o.ttft is not None]
    gaps = [g / scale for o in ok for g in o.gaps]
    e2es = [o.e2e / scale for o in ok if o.e2e is not None]
    span = max(span_wall_s / scale, 1e-9)
    good = 0
    for o in ok:
        if o.ttft is None or o.e2e is None:
            continue
        itl = (o.e2e - o.ttft) / (o.tokens - 1) / scale if o.tokens > 1 else 0.0
        if o.ttft / scale <= slo.ttft_s and itl <= slo.itl_s:
            good += 1
    mean = statistics.mean(per_pod) if per_pod else 0.0
    return RunResult(
        policy=policy,
        load=load,
        repeat=repeat,
        requests=len(outcomes),
        ok=len(ok),
        shed=shed,
        errors=errors,
        ttft=_percentiles(ttfts),
        itl=_percentiles(gaps),
        e2e=_percentiles(e2es),
        throughput_rps=len(ok) / span,
        output_tps=sum(o.tokens for o in ok) / span,
        goodput_rps=goodput(good, arrivals),
        imbalance=(max(per_pod) / mean) if mean > 0 else math.nan,
        per_pod=list(per_pod),
        wall_s=span_wall_s,
        lag=late_s / (span * max(1, len(per_pod))),
        behind=behind_s / busy_s if busy_s > 0 else 0.0,
        ttft_mean=statistics.mean(ttfts) if ttfts else math.nan,
        server_ttft_mean=server_ttft_mean,
        server_ttft=_percentiles(server_ttfts),
        prefix_hit_rate=prefix_hit_rate,
    )


@dataclass(frozen=True)
class Spread:
    """Median over repeats, with the smallest and largest repeat."""

    median: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high}


def spread(values: Sequence[float]) -> Spread:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return Spread(math.nan, math.nan, math.nan)
    return Spread(statistics.median(finite), min(finite), max(finite))


# Figures aggregated per (policy, load): name -> how to read it from a RunResult.
AGGREGATED: Mapping[str, Any] = {
    "ttft_p50": lambda r: r.ttft["p50"],
    "ttft_p90": lambda r: r.ttft["p90"],
    "ttft_p99": lambda r: r.ttft["p99"],
    "itl_p50": lambda r: r.itl["p50"],
    "itl_p90": lambda r: r.itl["p90"],
    "itl_p99": lambda r: r.itl["p99"],
    "e2e_p50": lambda r: r.e2e["p50"],
    "e2e_p90": lambda r: r.e2e["p90"],
    "e2e_p99": lambda r: r.e2e["p99"],
    "throughput_rps": lambda r: r.throughput_rps,
    "output_tps": lambda r: r.output_tps,
    "goodput_rps": lambda r: r.goodput_rps,
    "shed_rate": lambda r: r.shed / max(1, r.requests),
    "error_rate": lambda r: r.errors / max(1, r.requests),
    "imbalance": lambda r: r.imbalance,
    "lag": lambda r: r.lag,
    "behind": lambda r: r.behind,
    "path_overhead": lambda r: r.path_overhead,
    "server_ttft_p90": lambda r: r.server_ttft.get("p90", math.nan),
    "prefix_hit_rate": lambda r: r.prefix_hit_rate,
}


def aggregate(runs: Sequence[RunResult]) -> dict[str, Spread]:
    return {name: spread([read(r) for r in runs]) for name, read in AGGREGATED.items()}
