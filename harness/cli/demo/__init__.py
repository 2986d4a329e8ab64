"""``harness demo``: the whole system on this machine, a few hundred requests, and what happened.

What runs: a throw-away control plane (scheduler, controllers, upstream CRDs), the sample pool and
models (``harness.beds.stack.DEMO_MODELS``: a 70/30 weighted split, a LoRA target, a Sheddable model and
the base model, plus a Critical ``background-load`` model), 4 simulated vLLM pods, the EPP as its
own process, and a real Envoy in front. The requests go through Envoy with the ``openai`` SDK in
two phases (``harness.cli.demo.load``): a steady mix, then real saturation, in which background requests
fill every pod's queue and KV cache until the EPP sheds the Sheddable (and Standard) traffic with
429 while Critical requests are still served. Then it prints the report (``harness.cli.demo.report``)
and stops everything (``harness.cli.demo.environment``). Ctrl-C stops everything too.

``harness up --with-epp`` (``up_with_epp``) starts the same environment and keeps it running.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

from harness.base.binaries import BinaryNotFoundError
from harness.cli.command import StartError, no_children_left, say, signals_raise_interrupt
from harness.cli.demo.environment import LOAD_MODEL, SIM_CONFIG, DemoEnvironment, print_access
from harness.cli.demo.load import BACKGROUND_EXTRA_PER_POD, plan, run_phase
from harness.cli.demo.report import PhaseResults, collect, parse_epp_metrics, saturation_text
from harness.subject.foreign_epp import EppCommand

HELP: Final = "run the EPP, Envoy and 4 simulated pods locally, send requests, print what happened"

DEFAULT_REQUESTS: Final = 300
DEFAULT_CONCURRENCY: Final = 8
DEFAULT_SEED: Final = 7
# The EPP sheds a non-critical request when no pod has at most this many waiting and at most this
# KV-cache usage (its defaults QUEUE_THRESHOLD_CRITICAL and KV_CACHE_THRESHOLD).
SHED_QUEUE: Final = 5
SHED_KV: Final = 0.8
_WATCH_INTERVAL_S: Final = 0.5
# In the saturated phase Critical requests wait behind the background load: send more at once.
SATURATED_CONCURRENCY_FACTOR: Final = 4


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start a throw-away control plane, the demo pool and models, 4 simulated vLLM pods, the EPP "
        "and Envoy; send requests through Envoy with the openai SDK (a steady phase, then one where "
        "background requests really saturate every pod); print requests per pod and target model, "
        "shed and error counts and the EPP's metrics; stop everything. Ctrl-C stops everything too."
    )
    parser.add_argument(
        "--requests", type=int, default=DEFAULT_REQUESTS, metavar="N", help="requests to send (default 300)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        metavar="C",
        help="requests in flight (default 8; 4x that in the saturated phase, where they mostly queue)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the request mix (default 7)")
    add_epp_command_argument(parser)


def add_epp_command_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--epp-command",
        metavar="CMD",
        help="run this EPP instead of ours: a command line taking upstream's flag names (quoted), "
        "'upstream[:vX.Y.Z]' (built by `harness build --upstream-epp`) or 'ours'",
    )


def epp_command_of(args: argparse.Namespace) -> EppCommand | None:
    """``--epp-command`` as an ``EppCommand`` (None: ours, as ``EppProcess`` runs it)."""
    text = getattr(args, "epp_command", None)
    return EppCommand.from_text(text) if text else None


def run(args: argparse.Namespace) -> int:
    """The demo: start, send, report, stop. 0 on success, 1 if start-up failed, 130 on Ctrl-C."""
    if args.requests < 2 or args.concurrency < 1:
        print("error: --requests must be >= 2 and --concurrency >= 1", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        env = DemoEnvironment(epp_command=epp_command_of(args))
    except BinaryNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with signals_raise_interrupt():
        try:
            env.start()
            results = drive(env, args.requests, args.concurrency, random.Random(args.seed))
            print(collect(env, results, LOAD_MODEL.model_name).render(), flush=True)
            say("\nstopping everything ...")
            status = 0
        except KeyboardInterrupt:
            print("\ninterrupted; stopping everything", file=sys.stderr, flush=True)
            status = 130
        except StartError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
        finally:
            stopping = time.monotonic()
            env.stop()
    if not no_children_left():
        return 1
    if status == 0:
        say(
            f"  stopped in {time.monotonic() - stopping:.1f} s; the demo took"
            f" {time.monotonic() - started:.1f} s and left no process behind"
        )
    return status


def saturated(metrics: dict[str, Any]) -> bool:
    """What makes the EPP shed: this pod has no room for a non-critical request."""
    return bool(metrics["waitingQueueSize"] > SHED_QUEUE or metrics["kvCacheUsagePercent"] > SHED_KV)


def drive(env: DemoEnvironment, total: int, concurrency: int, rng: random.Random) -> PhaseResults:
    stack = env.running_stack
    steady, saturated_calls = plan(total, rng)
    results = PhaseResults()
    # v1: the objective header of each request's model (v1alpha2: none, the model says it).
    headers = stack.cluster.objective_headers_of_body if stack.cluster is not None else None
    say(
        f"steady phase: {len(steady)} requests, {concurrency} in flight (chat and completions, some streamed)"
    )
    run = run_phase("steady", stack.base_url, steady, concurrency, headers_of_body=headers)
    results.steady_seconds, results.outcomes = run.seconds, run.outcomes

    background = env.pods * (SIM_CONFIG.max_num_seqs + BACKGROUND_EXTRA_PER_POD)
    results.background_in_flight = background
    say(
        f"saturated phase: {background} long Critical {LOAD_MODEL.model_name} requests kept in flight "
        f"until every pod has more than {SHED_QUEUE} waiting or KV above {SHED_KV:.0%} (real load)"
    )
    if stack.white_box:
        before: Callable[[], Any] = lambda: env.wait_epp_sees(saturated, "every pod saturated")  # noqa: E731
    else:
        before = lambda: env.wait_sheddable(shed=True)  # noqa: E731
    run = run_phase(
        "saturated",
        stack.base_url,
        saturated_calls,
        concurrency * SATURATED_CONCURRENCY_FACTOR,
        background=(background, LOAD_MODEL.model_name),
        before=before,
        after=lambda: parse_epp_metrics(stack.epp_metrics_text()),
        headers_of_body=headers,
    )
    results.saturated_seconds = run.seconds
    results.outcomes += run.outcomes
    results.saturation_seen = list(run.before or [])
    results.metrics_saturated = run.after
    if stack.white_box:
        say(f"  the EPP saw, per pod, when the phase began: {saturation_text(results.saturation_seen)}")
        env.wait_epp_sees(lambda m: not saturated(m), "the end of saturation")
    else:
        say(f"  {stack.epp_name} shows no datastore: it shed a Sheddable request when the phase began")
        env.wait_sheddable(shed=False)
    return results


def split_pool(text: str) -> tuple[str, str]:
    """``[NAMESPACE/]NAME`` -> (namespace, name); the namespace defaults to ``default``."""
    namespace, _, name = text.rpartition("/")
    return namespace or "default", name


def up_with_epp(args: argparse.Namespace) -> int:
    """``harness up --with-epp``: the demo's environment, kept running until Ctrl-C or SIGTERM."""
    if getattr(args, "no_crds", False):
        print("error: --with-epp needs the CRDs; drop --no-crds", file=sys.stderr)
        return 2
    stop_requested = False
    pool = getattr(args, "pool", None)
    try:
        env = DemoEnvironment(pool=split_pool(pool) if pool else None, epp_command=epp_command_of(args))
    except BinaryNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    with signals_raise_interrupt():
        try:
            try:
                env.start()
            except KeyboardInterrupt:
                print("interrupted during start; stopping", file=sys.stderr, flush=True)
                return 0
            except StartError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, request_stop)
            print_access(env, getattr(args, "write_kubeconfig", None))
            while not stop_requested:
                time.sleep(_WATCH_INTERVAL_S)
                dead = env.dead_processes()
                if dead:
                    print(f"error: {', '.join(dead)} exited unexpectedly; stopping", file=sys.stderr)
                    print(env.log_tails(), file=sys.stderr)
                    return 1
            print("stopping ...", flush=True)
            return 0
        finally:
            env.stop()
