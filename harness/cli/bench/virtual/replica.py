"""A finished live run replayed in virtual time: the same engines, traces, rates and routers' roles.

The virtual mode's figures (64 calibrated pods, unshrunk lengths) are worth quoting only if, on a
configuration the live bench can run, virtual time reproduces what the live cluster measured. This
builds the live run's twin, so ``benchmarks/bench_cross_validation.py`` can compare the two:

* the engine is the live simulators' own ``SimConfig`` (the small preset), in virtual time;
* every trace is the live one, request for request: the same workload spec, seed and rate (the
  live run's measured capacity times each load, ``runner.trace_spec``);
* the EPP's prober scrapes as the live one did: its refresh interval in wall seconds is
  ``1 / time_scale`` of that in simulated seconds;
* each live policy runs as the virtual router that plays its part (``LIVE_TO_VIRTUAL``): Envoy's
  LEAST_REQUEST is power of two choices over in-flight counts when all weights are equal, so its
  twin is ``power-of-two``, not ``least-outstanding``; the EPP, which gets no response body from the
  live bench's gateway, is ``epp[no-response-body]``;
* the same warm-up share is left out as the live summary leaves out (``warmup_fraction``).

What the twin cannot have: the live path's own delay (Envoy, the EPP's gRPC round trip, the
loopback HTTP of the simulators; about a millisecond of wall time) and the host's CPU lag.
"""

from __future__ import annotations

import time
from dataclasses import replace

from epp.config import DEFAULT_REFRESH_METRICS_INTERVAL
from harness.cli.bench import report
from harness.cli.bench.runner import BenchResult, trace_spec
from harness.cli.bench.virtual.cluster import ClusterConfig, VirtualCluster
from harness.cli.bench.virtual.routers import (
    EPP_NO_RESPONSE_BODY,
    ORACLE,
    POWER_OF_TWO,
    RANDOM,
    ROUND_ROBIN,
    make_router,
)
from harness.cli.bench.virtual.runner import VirtualConfig, summarize
from harness.cli.bench.workload import generate

LIVE_TO_VIRTUAL = {
    # The live bench's EPP sits behind the harness's default gateway, which sends it no response body.
    report.EPP: EPP_NO_RESPONSE_BODY,
    report.ROUND_ROBIN: ROUND_ROBIN,
    report.LEAST_REQUEST: POWER_OF_TWO,
    "envoy-random": RANDOM,
    report.ORACLE: ORACLE,
}


def replay_in_virtual_time(
    live: BenchResult, refresh_interval_wall_s: float = DEFAULT_REFRESH_METRICS_INTERVAL
) -> BenchResult:
    """The live run's twin: every policy of ``live`` that has one, on every (load, repeat) it ran.

    ValueError when the live run cannot be twinned: EPP flags of its own (the twin runs the default
    scheduler) or no measured capacity."""
    config = live.config
    if config.epp_args or config.epp_variants:
        raise ValueError(
            "the virtual twin runs the EPP's default scheduler: run the live bench without EPP flags"
        )
    if live.capacity_rps <= 0:
        raise ValueError("the live run has no measured capacity to replay at")
    policies = [p for p in live.policies if p in LIVE_TO_VIRTUAL]
    sim = replace(config.sim, time_scale=0.0)
    scrape = refresh_interval_wall_s / config.time_scale
    twin = VirtualConfig(
        workload=config.workload_name,
        pods=config.pods,
        requests=config.requests,
        loads=config.loads,
        repeats=config.repeats,
        policies=tuple(policies),
        seed=config.seed,
        slo=config.slo,
        warmup=config.warmup_fraction,
    )
    result = BenchResult(replace(config, mode="virtual"), capacity_rps=live.capacity_rps, policies=policies)
    began = time.monotonic()
    for load_index, load in enumerate(config.loads):
        for repeat in range(config.repeats):
            trace = generate(trace_spec(config, live.capacity_rps, load_index, repeat))
            for policy in policies:
                cluster = VirtualCluster(
                    ClusterConfig(config.pods, sim, scrape_interval=scrape, seed=config.seed + repeat)
                )
                started = time.monotonic()
                records = cluster.run(
                    trace.requests, make_router(LIVE_TO_VIRTUAL[policy], config.seed + repeat)
                )
                result.runs.append(
                    summarize(policy, load, repeat, records, cluster, twin, time.monotonic() - started)
                )
    result.wall_s = time.monotonic() - began
    result.notes.append(
        f"virtual twin of a live run: scrapes every {scrape * 1000:.1f} simulated ms "
        f"({refresh_interval_wall_s * 1000:g} ms of wall time at time scale {config.time_scale:g})"
    )
    return result
