"""``harness bench routing``: the routing benchmark from the command line."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Final

from harness.cli.bench import report
from harness.cli.bench.policies import epp_variant
from harness.cli.bench.runner import (
    DEFAULT_LENGTH_SCALE,
    DEFAULT_LOADS,
    DEFAULT_SIM,
    HEADLINE_LOAD,
    BenchConfig,
    BenchResult,
    default_workload,
    run_benchmark,
)
from harness.cli.bench.stats import RunResult, Slo
from harness.cli.bench.virtual.routers import KNOWN as VIRTUAL_KNOWN
from harness.cli.bench.virtual.runner import VIRTUAL_SLO, VirtualConfig, run_virtual
from harness.cli.bench.workload import SharedPrefix, WorkloadSpec
from harness.cli.bench.workloads import SHARED_PREFIX, SHAREGPT, VIRTUAL_WORKLOADS
from harness.cli.command import (
    StartError,
    interrupts_deferred,
    no_children_left,
    say,
    signals_raise_interrupt,
    start_control_plane,
)
from harness.cli.console import ProgressBar, console, print_table, progress_bar
from harness.sim import SimConfig

DEFAULT_OUT: Final = Path("bench-results")
# The shared-prefix prompts are long (~450 tokens at the default length scale): a KV cache that holds
# a few of them per pod, and about one pod's worth of the 16 groups' system prompts.
SHARED_PREFIX_GPU_BLOCKS: Final = 256


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "Benchmarks that print figures (nothing is asserted)."
    kinds = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    routing = kinds.add_parser(
        "routing",
        help="EPP vs round robin, least-request, random, vllm-router, sglang-router and an oracle",
        description=(
            "Start a throw-away control plane, N simulated vLLM pods, the EPP behind Envoy, Envoy's own "
            "load balancers, the peer routers (when installed) and an oracle; measure the pool's capacity; "
            "replay the same request traces through every policy at each load; write a Markdown table, "
            "a JSON file and a PNG plot, and print the ratios at 0.9x capacity."
        ),
    )
    routing.add_argument(
        "--virtual",
        action="store_true",
        help="virtual time: the EPP's scheduling code and every peer against calibrated engines in a "
        "discrete-event loop (no cluster, no wall clock); defaults 64 pods, 20,000 requests, load 0.9, "
        "1 repeat",
    )
    routing.add_argument("--pods", type=int, default=None, help="simulated pods (default 8; virtual 64)")
    routing.add_argument(
        "--loads",
        type=_floats,
        default=None,
        help="loads as fractions of the measured capacity (default 0.5,0.8,0.9,1.0,1.2; virtual 0.9)",
    )
    routing.add_argument("--repeats", type=int, default=None, help="traces per load (default 3; virtual 1)")
    routing.add_argument(
        "--requests",
        type=int,
        default=None,
        help=f"requests per trace (default {BenchConfig.requests}; virtual {VirtualConfig.requests})",
    )
    routing.add_argument(
        "--policies",
        type=lambda text: tuple(p for p in text.split(",") if p),
        default=(),
        help="comma-separated policies (default: all available): epp, envoy-round-robin, "
        "envoy-least-request, envoy-random, oracle, vllm-router:{round_robin,power_of_two,cache_aware}, "
        "sglang-router:{round_robin,cache_aware}; virtual: " + ", ".join(VIRTUAL_KNOWN),
    )
    routing.add_argument(
        "--workload",
        choices=(*VIRTUAL_WORKLOADS, SHARED_PREFIX),
        default=SHAREGPT,
        help="ShareGPT-like lengths (default), shared-prefix (live); virtual: "
        + ", ".join(VIRTUAL_WORKLOADS)
        + " (harness/cli/bench/workloads.py)",
    )
    routing.add_argument("--arrival", choices=("poisson", "gamma"), default="poisson")
    routing.add_argument(
        "--length-scale",
        type=float,
        default=DEFAULT_LENGTH_SCALE,
        help=f"multiplies prompt and output lengths (default {DEFAULT_LENGTH_SCALE:g})",
    )
    routing.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULT_SIM.time_scale,
        help=f"wall seconds per simulated second (default {DEFAULT_SIM.time_scale:g})",
    )
    routing.add_argument(
        "--slo-ttft",
        type=float,
        default=None,
        help=f"goodput TTFT limit, s (default {Slo().ttft_s:g}; virtual {VIRTUAL_SLO.ttft_s:g})",
    )
    routing.add_argument(
        "--slo-itl",
        type=float,
        default=None,
        help=f"goodput mean ITL limit, s (default {Slo().itl_s:g}; virtual {VIRTUAL_SLO.itl_s:g})",
    )
    routing.add_argument(
        "--capacity-requests",
        type=int,
        default=BenchConfig.capacity_requests,
        help=f"requests in the capacity probe's burst (default {BenchConfig.capacity_requests})",
    )
    routing.add_argument("--seed", type=int, default=1)
    routing.add_argument(
        "--epp-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra EPP flag (repeatable), e.g. --epp-arg=--scheduler=filter-tree",
    )
    routing.add_argument(
        "--epp-variants",
        type=lambda text: tuple(v for v in text.split(",") if v),
        default=(),
        metavar="V1,V2",
        help="also run the EPP configured as each variant (an ablation): filter-tree, scorer, "
        "no-<scorer> or only-<scorer> with scorer one of queue, kv_cache, prefix, lora, in_flight, "
        "last_routed, predicted_ttft; or v1-gateway (the default EPP behind upstream's v1 Envoy set-up, "
        "response bodies to the EPP, so the predicted-TTFT scorer decides)",
    )
    routing.add_argument(
        "--epp-peer",
        action="append",
        default=[],
        metavar="SPEC",
        help="also run another EPP behind its own Envoy (repeatable, live only): gie-vX.Y.Z for upstream "
        "GIE's EPP (`harness build --upstream-epp vX.Y.Z` first), or NAME=COMMAND for any EPP binary, "
        'e.g. llm-d-router="$(harness build --epp-source DIR)"; its flag dialect is read off its --help',
    )
    routing.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output directory (default bench-results)"
    )


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected numbers like 0.5,0.9: {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("loads must be positive")
    return values


def virtual_config_from(args: argparse.Namespace) -> VirtualConfig:
    """The virtual-time benchmark's settings; ValueError for a workload or policy it does not know."""
    if args.workload not in VIRTUAL_WORKLOADS:
        raise ValueError(f"--virtual runs the workloads {', '.join(VIRTUAL_WORKLOADS)}, not {args.workload}")
    policies = tuple(args.policies) or VirtualConfig.policies
    unknown = [p for p in policies if p not in VIRTUAL_KNOWN]
    if unknown:
        raise ValueError(f"unknown virtual policies {', '.join(unknown)}; known: {', '.join(VIRTUAL_KNOWN)}")
    defaults = VirtualConfig()
    return VirtualConfig(
        workload=args.workload,
        pods=args.pods if args.pods is not None else defaults.pods,
        requests=args.requests if args.requests is not None else defaults.requests,
        loads=tuple(args.loads) if args.loads is not None else defaults.loads,
        repeats=args.repeats if args.repeats is not None else defaults.repeats,
        policies=policies,
        seed=args.seed,
        slo=Slo(
            ttft_s=args.slo_ttft if args.slo_ttft is not None else VIRTUAL_SLO.ttft_s,
            itl_s=args.slo_itl if args.slo_itl is not None else VIRTUAL_SLO.itl_s,
        ),
    )


def config_from(args: argparse.Namespace) -> BenchConfig:
    """The benchmark's settings; ValueError for an unknown EPP variant."""
    if args.workload not in ("sharegpt", SHARED_PREFIX):
        raise ValueError(
            f"the live benchmark runs sharegpt or shared-prefix; {args.workload} needs --virtual"
        )
    for variant in args.epp_variants:
        epp_variant(variant)
    shared = SharedPrefix() if args.workload == "shared-prefix" else None
    workload = default_workload(arrival=args.arrival, length_scale=args.length_scale, shared_prefix=shared)
    sim = replace(DEFAULT_SIM, time_scale=args.time_scale)
    if shared is not None:
        sim = replace(sim, num_gpu_blocks=SHARED_PREFIX_GPU_BLOCKS)
    return BenchConfig(
        pods=args.pods if args.pods is not None else 8,
        loads=tuple(args.loads) if args.loads is not None else DEFAULT_LOADS,
        repeats=args.repeats if args.repeats is not None else 3,
        requests=args.requests if args.requests is not None else BenchConfig.requests,
        policies=tuple(args.policies),
        workload=workload,
        sim=sim,
        slo=Slo(
            ttft_s=args.slo_ttft if args.slo_ttft is not None else Slo().ttft_s,
            itl_s=args.slo_itl if args.slo_itl is not None else Slo().itl_s,
        ),
        workload_name=live_workload_name(args.workload, args.arrival, workload, sim),
        seed=args.seed,
        capacity_requests=args.capacity_requests,
        epp_args=tuple(args.epp_arg),
        epp_variants=tuple(args.epp_variants),
        epp_peers=tuple(args.epp_peer),
    )


def live_workload_name(name: str, arrival: str, workload: WorkloadSpec, sim: SimConfig) -> str:
    """What the live workload is, as every ratio of the report names it: its lengths' shape, and the
    adapters most of its requests go to (over few LoRA slots, where adapter affinity decides), so
    a ratio is never read as one measured on base-model traffic alone."""
    label = name
    if workload.adapters and workload.base_share < 1:
        share = round(100 * (1 - workload.base_share))
        label += f" + {len(workload.adapters)} adapters over {sim.max_loras} slots ({share}% of requests)"
    return label if arrival == "poisson" else f"{label}, gamma arrivals"


class _BarReporter:
    """Phases as lines; runs as one progress bar with the last run's TTFT p90 beside it."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._bar: ProgressBar | None = None

    def phase(self, message: str) -> None:
        say(f"  {message}")

    def planned(self, runs: int) -> None:
        self._bar = self._stack.enter_context(progress_bar("runs", runs))

    def run_done(self, run: RunResult) -> None:
        if self._bar is not None:
            self._bar.advance()
            self._bar.note(last=f"{run.policy} @ {run.load:g}: TTFT p90 {report.ms(run.ttft['p90'])}")

    def close(self) -> None:
        self._bar = None
        self._stack.close()


def run_virtual_mode(args: argparse.Namespace) -> int:
    try:
        config = virtual_config_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.pods < 1 or config.repeats < 1 or config.requests < 10:
        print("error: --pods, --repeats >= 1; --requests >= 10", file=sys.stderr)
        return 2
    say(
        f"virtual routing benchmark: {config.pods} calibrated engines, {config.workload} workload, "
        f"{config.requests} requests, loads {', '.join(f'{x:g}' for x in config.loads)}"
    )
    reporter = _BarReporter()
    began = time.monotonic()
    try:
        result = run_virtual(config, reporter)
    finally:
        reporter.close()
    paths = report.write(result, args.out, stem=f"routing-virtual-{config.workload}")
    _print_summary(result)
    say(f"wrote {paths['markdown']}, {paths['json']} and {paths['plot']}")
    say(f"the virtual benchmark took {time.monotonic() - began:.0f} s")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.benchmark != "routing":  # pragma: no cover - argparse restricts the choice
        return 2
    if args.virtual:
        return run_virtual_mode(args)
    if args.time_scale <= 0:
        print("error: --time-scale must be positive", file=sys.stderr)
        return 2
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.pods < 1 or config.repeats < 1 or config.requests < 10 or config.capacity_requests < 20:
        print("error: --pods, --repeats >= 1; --requests >= 10; --capacity-requests >= 20", file=sys.stderr)
        return 2
    # sglang-router probes each worker with an HTTP/2 preface first (is it a gRPC server?); the
    # simulators answer 400 as vLLM's HTTP/1 server would, and aiohttp would log a traceback each time.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    began = time.monotonic()
    status = 0
    plane = None
    reporter = _BarReporter()
    with signals_raise_interrupt():
        try:
            plane = start_control_plane()
            say(f"routing benchmark: {config.pods} pods, loads {', '.join(f'{x:g}' for x in config.loads)}")
            result = run_benchmark(config, plane.access, reporter=reporter)
            reporter.close()
            paths = report.write(result, args.out)
            _print_summary(result)
            say(f"wrote {paths['markdown']}, {paths['json']} and {paths['plot']}")
        except KeyboardInterrupt:
            print("\ninterrupted; stopping everything", file=sys.stderr, flush=True)
            status = 130
        except (StartError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
        finally:
            reporter.close()
            with interrupts_deferred():
                if plane is not None:
                    plane.stop()
    if not no_children_left():
        return 1
    if status == 0:
        say(f"the benchmark took {time.monotonic() - began:.0f} s and left no process behind")
    return status


def _print_summary(result: BenchResult) -> None:
    out = console()
    for line in report.describe(result):
        out.print(line)
    loads = [HEADLINE_LOAD] if HEADLINE_LOAD in result.config.loads else list(result.config.loads)
    at = ", ".join(f"{x:g}" for x in loads)
    print_table(
        f"Routing at {at}x capacity (median of {result.config.repeats} repeats)",
        report.COLUMNS,
        report.rows(result, loads),
        out=out,
    )
    for ratio in report.ratios(result):
        out.print(f"  {ratio.line()}")
    for note in result.notes:
        out.print(f"  note: {note}")
