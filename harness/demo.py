"""``harness demo``: the whole system on this machine, a few hundred requests, and what happened.

What runs: a throw-away control plane (scheduler, controllers, upstream CRDs), the sample pool and
models (``harness.stack.DEMO_MODELS``: a 70/30 weighted split, a LoRA target, a Sheddable model and
the base model), 4 simulated vLLM pods, the EPP as its own process, and a real Envoy in front. The
requests go through Envoy with the ``openai`` SDK, in two phases:

1. **steady**: a mix across the models, chat and completions, some streamed;
2. **saturated**: every simulator's ``/metrics`` is pinned to look full (queue and KV cache over
   the EPP's thresholds). The EPP then sheds non-Critical requests with 429 and still routes
   Critical ones. The saturation is *reported*, not real load: it is deterministic on a 2-core box.

Then it prints requests per pod and target model (as the simulators counted them, with Envoy's
access log as a cross-check), the client's view per requested model (ok / shed / errors), and the
EPP's own metrics; then stops everything. Ctrl-C stops everything too.

``harness up --with-epp`` (``up_with_epp``) starts the same environment and keeps it running.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import random
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final, TextIO

from harness.binaries import kubectl_path
from harness.controlplane import ControlPlane, ControlPlaneStartError
from harness.eventually import eventually
from harness.go_binaries import ensure_all, missing_binaries
from harness.guards import child_processes
from harness.stack import BASE_MODEL, DEMO_MODELS, ModelSpec, Stack, StackOptions
from harness.testbed import TestBed

HELP: Final = "run the EPP, Envoy and 4 simulated pods locally, send requests, print what happened"

NAMESPACE: Final = "demo"
DEFAULT_REQUESTS: Final = 300
DEFAULT_CONCURRENCY: Final = 8
DEFAULT_SEED: Final = 7
# Share of the requests sent while the pods report saturation.
SATURATED_SHARE: Final = 0.2
# What every simulator reports during the saturated phase: over the EPP's defaults
# (queue_threshold_critical 5, kv_cache_threshold 0.8) on every pod.
SATURATED_WAITING: Final = 10
SATURATED_RUNNING: Final = 8
SATURATED_KV: Final = 0.95
STREAM_SHARE: Final = 0.3
CHAT_SHARE: Final = 0.5
MAX_TOKENS_RANGE: Final = (8, 32)
REQUEST_TIMEOUT_S: Final = 30.0
METRICS_SETTLE_TIMEOUT_S: Final = 10.0
ACCESS_LOG_TIMEOUT_S: Final = 5.0
SIM_PORT: Final = 8000
_WATCH_INTERVAL_S: Final = 0.5

# How often each requested model appears in the steady phase.
MIX: Final[dict[str, float]] = {
    "food-review": 0.35,
    "sql-lora": 0.25,
    BASE_MODEL: 0.2,
    "summaries-batch": 0.2,
}
PROMPTS: Final[dict[str, tuple[str, ...]]] = {
    "food-review": (
        "Review: the ramen was rich and the noodles perfectly chewy. Sentiment?",
        "Review: cold fries, slow service, never again. Sentiment?",
        "Review: decent pizza, but the crust was soggy in the middle. Sentiment?",
    ),
    "sql-lora": (
        "Write SQL: the ten customers with the highest total order value in 2024.",
        "Write SQL: monthly active users per country, last six months.",
    ),
    "summaries-batch": (
        "Summarize the following meeting notes in three bullet points: budget approved, launch moved "
        "to May, hiring two engineers, on-call rotation changes next week.",
        "Summarize this article in one sentence: the city council voted to extend the tram line.",
    ),
}
DEFAULT_PROMPTS: Final = (
    "Explain what a KV cache is in two sentences.",
    "Write a haiku about load balancers.",
)

CONNECTION_ERROR: Final = 0  # Outcome.status when no HTTP response came back


# ---------------------------------------------------------------------------- the command line


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start a throw-away control plane, the demo pool and models, 4 simulated vLLM pods, the EPP "
        "and Envoy; send requests through Envoy with the openai SDK (a steady phase, then one where "
        "every pod reports saturation); print requests per pod and target model, shed and error "
        "counts and the EPP's metrics; stop everything. Ctrl-C stops everything too."
    )
    parser.add_argument(
        "--requests", type=int, default=DEFAULT_REQUESTS, metavar="N", help="requests to send (default 300)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        metavar="C",
        help="requests in flight (default 8)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the request mix (default 7)")


def run(args: argparse.Namespace) -> int:
    """The demo: start, send, report, stop. 0 on success, 1 if start-up failed, 130 on Ctrl-C."""
    if args.requests < 2 or args.concurrency < 1:
        print("error: --requests must be >= 2 and --concurrency >= 1", file=sys.stderr)
        return 2
    started = time.monotonic()
    env = DemoEnvironment()
    with _signals_raise_interrupt():
        try:
            env.start()
            results = _drive(env, args.requests, args.concurrency, random.Random(args.seed))
            print(_collect(env, results).render(), flush=True)
            _say("\nstopping everything ...")
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
    if not _no_children_left():
        return 1
    if status == 0:
        _say(
            f"  stopped in {time.monotonic() - stopping:.1f} s; the demo took"
            f" {time.monotonic() - started:.1f} s and left no process behind"
        )
    return status


def up_with_epp(args: argparse.Namespace) -> int:
    """``harness up --with-epp``: the demo's environment, kept running until Ctrl-C or SIGTERM."""
    if getattr(args, "no_crds", False):
        print("error: --with-epp needs the CRDs; drop --no-crds", file=sys.stderr)
        return 2
    stop_requested = False
    env = DemoEnvironment()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    with _signals_raise_interrupt():
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
            _print_access(env, getattr(args, "write_kubeconfig", None))
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


# ---------------------------------------------------------------------------- the environment


class StartError(RuntimeError):
    """The environment did not come up; the message says which part and why."""


class DemoEnvironment:
    """Control plane + ``Stack`` in the ``demo`` namespace; ``stop()`` is idempotent."""

    def __init__(self, pods: int = 4, models: Sequence[ModelSpec] = DEMO_MODELS) -> None:
        self.pods = pods
        self.models = tuple(models)
        self.plane: ControlPlane | None = None
        self.stack: Stack | None = None

    def start(self) -> None:
        if missing_binaries():
            _say("the control-plane binaries are not cached yet: building them once (later runs skip this)")
        try:
            ensure_all()
        except Exception as exc:
            raise StartError(f"no control-plane binaries: {exc}") from exc
        began = time.monotonic()
        _say("starting the control plane (etcd, kube-apiserver, scheduler, controller-manager, CRDs) ...")
        self.plane = ControlPlane()
        try:
            self.plane.start()
        except ControlPlaneStartError as exc:
            raise StartError(str(exc)) from exc
        _say(f"  up in {time.monotonic() - began:.1f} s at {self.plane.server_url}")
        began = time.monotonic()
        _say(f"starting {self.pods} simulated vLLM pods, the pool and models, the EPP and Envoy ...")
        self.stack = Stack(
            self.plane.access, StackOptions(namespace=NAMESPACE, pods=self.pods, models=self.models)
        )
        try:
            self.stack.start()
        except Exception as exc:
            raise StartError(f"the stack did not start: {exc}") from exc
        _say(f"  up in {time.monotonic() - began:.1f} s; Envoy listens on {self.stack.base_url}")

    def stop(self) -> None:
        """Stop the stack, then the control plane; further Ctrl-C only prints a note meanwhile."""
        with _interrupts_deferred():
            try:
                if self.stack is not None:
                    self.stack.stop()
                    self.stack = None
            finally:
                if self.plane is not None:
                    self.plane.stop()
                    self.plane = None

    @property
    def running_stack(self) -> Stack:
        if self.stack is None:
            raise RuntimeError("the demo environment is not running")
        return self.stack

    def dead_processes(self) -> list[str]:
        dead: list[str] = []
        if self.plane is not None:
            dead += [p.name for p in self.plane.processes if not p.running]
        if self.stack is not None and self.stack.envoy is not None and not self.stack.envoy.running:
            dead.append("envoy")
        if self.stack is not None and self.stack.epp is not None and not self.stack.epp.running:
            dead.append("epp")
        return dead

    def log_tails(self) -> str:
        parts = []
        if self.plane is not None:
            for process in self.plane.processes:
                parts.append(f"--- {process.name} log ---\n{process.log_tail()}")
        if self.stack is not None:
            if self.stack.epp is not None:
                parts.append(f"--- epp log ---\n{self.stack.epp.log_tail()}")
            if self.stack.envoy is not None:
                parts.append(f"--- envoy log ---\n{self.stack.envoy.log_tail()}")
        return "\n".join(parts)

    # -- saturation, as the simulators report it ------------------------------------------------
    def saturate(self) -> None:
        bed = self._bed()
        for name in bed.pods:
            bed.set_gauges(name, waiting=SATURATED_WAITING, running=SATURATED_RUNNING, kv_cache=SATURATED_KV)
        self._wait_epp_sees(lambda m: m["waitingQueueSize"] >= SATURATED_WAITING, "saturation")

    def unsaturate(self) -> None:
        bed = self._bed()
        for pod in bed.pods.values():
            for sim in pod.sims.values():
                sim.sim.clear_overrides()
        self._wait_epp_sees(lambda m: m["waitingQueueSize"] < SATURATED_WAITING, "the end of saturation")

    def _bed(self) -> TestBed:
        bed = self.running_stack.bed
        if bed is None:
            raise RuntimeError("the stack has no pods")
        return bed

    def _wait_epp_sees(self, condition: Callable[[dict[str, Any]], bool], what: str) -> None:
        stack = self.running_stack

        def seen() -> None:
            pods = stack.datastore_view().get("pods") or []
            assert len(pods) == self.pods, f"EPP holds {len(pods)}/{self.pods} pods"
            assert all(condition(p["metrics"]) for p in pods), f"EPP does not see {what} yet"

        eventually(seen, timeout=METRICS_SETTLE_TIMEOUT_S, message=f"the EPP saw {what}")


def _print_access(env: DemoEnvironment, copy_to: Path | None) -> None:
    plane, stack = env.plane, env.running_stack
    assert plane is not None
    assert stack.epp is not None
    kubeconfig = plane.kubeconfig_path
    if copy_to is not None:
        shutil.copyfile(kubeconfig, copy_to)
        copy_to.chmod(0o600)
        kubeconfig = copy_to.resolve()
    kubectl = (
        f"{shlex.quote(str(kubectl_path()))} --kubeconfig {shlex.quote(str(kubeconfig))} "
        f"-n {NAMESPACE} get inferencepools,inferencemodels,pods -o wide"
    )
    body = '{"model": "food-review", "prompt": "Review: great tacos. Sentiment?", "max_tokens": 16}'
    curl = f"curl -s {stack.base_url}/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"
    print(f"environment is up: control plane, EPP, Envoy and {env.pods} simulated vLLM pods", flush=True)
    print(f"kubeconfig: {kubeconfig}")
    print(f"kubectl:    {kubectl}")
    print(f"export OPENAI_BASE_URL={stack.base_url}")
    print("export OPENAI_API_KEY=unused")
    print(f"curl:       {curl}")
    print(f"EPP:        {stack.epp.metrics_url}/metrics  {stack.epp.debug_url}/debug/datastore")
    print("models:")
    for model in env.models:
        print(f"  {model.model_name:<34} {model.criticality or 'Standard':<10} {_targets_text(model)}")
    print("Press Ctrl-C to stop.", flush=True)


def _targets_text(model: ModelSpec) -> str:
    if not model.targets:
        return "(served as is)"
    weights = [w for _, w in model.targets]
    if len(model.targets) == 1:
        return f"-> {model.targets[0][0]}"
    total = sum(w or 0 for w in weights) or len(weights)
    return "-> " + ", ".join(f"{name} {100 * (w or 1) / total:.0f}%" for name, w in model.targets)


# ---------------------------------------------------------------------------- the requests


@dataclass(frozen=True)
class Call:
    phase: str
    model: str
    chat: bool
    stream: bool
    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Outcome:
    call: Call
    status: int  # HTTP status; CONNECTION_ERROR when none came back
    target: str | None  # the model that answered (the response's ``model``)
    seconds: float


def plan(total: int, rng: random.Random) -> tuple[list[Call], list[Call]]:
    """The steady phase (weighted mix) and the saturated phase (every model in turn)."""
    saturated_count = max(1, round(total * SATURATED_SHARE))
    names, weights = list(MIX), list(MIX.values())
    steady = [_call("steady", rng.choices(names, weights)[0], rng) for _ in range(total - saturated_count)]
    saturated = [_call("saturated", names[i % len(names)], rng) for i in range(saturated_count)]
    rng.shuffle(saturated)
    return steady, saturated


def _call(phase: str, model: str, rng: random.Random) -> Call:
    return Call(
        phase=phase,
        model=model,
        chat=rng.random() < CHAT_SHARE,
        stream=rng.random() < STREAM_SHARE,
        prompt=rng.choice(PROMPTS.get(model, DEFAULT_PROMPTS)),
        max_tokens=rng.randint(*MAX_TOKENS_RANGE),
    )


async def send(client: Any, call: Call) -> Outcome:
    """One request through the ``openai`` SDK; HTTP errors become the outcome's status."""
    import openai

    began = time.monotonic()
    target: str | None = None
    try:
        if call.chat:
            messages = [{"role": "user", "content": call.prompt}]
            if call.stream:
                chat_stream = await client.chat.completions.create(
                    model=call.model, messages=messages, max_tokens=call.max_tokens, stream=True,
                    stream_options={"include_usage": True},
                )  # fmt: skip
                async for chat_chunk in chat_stream:
                    target = target or chat_chunk.model
            else:
                reply = await client.chat.completions.create(
                    model=call.model, messages=messages, max_tokens=call.max_tokens
                )
                target = reply.model
        elif call.stream:
            stream = await client.completions.create(
                model=call.model, prompt=call.prompt, max_tokens=call.max_tokens, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            async for chunk in stream:
                target = target or chunk.model
        else:
            completion = await client.completions.create(
                model=call.model, prompt=call.prompt, max_tokens=call.max_tokens
            )
            target = completion.model
        status = 200
    except openai.APIStatusError as exc:
        status = exc.status_code
    except openai.APIConnectionError:  # includes timeouts
        status = CONNECTION_ERROR
    return Outcome(call, status, target, time.monotonic() - began)


async def send_all(
    base_url: str, calls: Sequence[Call], concurrency: int, on_done: Callable[[Outcome], None]
) -> list[Outcome]:
    """Send ``calls`` with at most ``concurrency`` in flight (no retries: a 429 stays a 429)."""
    import openai

    queue: asyncio.Queue[Call] = asyncio.Queue()
    for call in calls:
        queue.put_nowait(call)
    outcomes: list[Outcome] = []
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:

        async def worker() -> None:
            while not queue.empty():
                outcome = await send(client, queue.get_nowait())
                outcomes.append(outcome)
                on_done(outcome)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(calls)))))
    return outcomes


def _drive(env: DemoEnvironment, total: int, concurrency: int, rng: random.Random) -> PhaseResults:
    stack = env.running_stack
    steady, saturated = plan(total, rng)
    results = PhaseResults()
    _say(
        f"steady phase: {len(steady)} requests, {concurrency} in flight (chat and completions, some streamed)"
    )
    results.steady_seconds, results.outcomes = _run_phase("steady", stack.base_url, steady, concurrency)
    _say(
        f"saturated phase: every simulator now reports {SATURATED_WAITING} waiting and "
        f"{SATURATED_KV:.0%} KV cache (pinned gauges: simulated saturation, not real load)"
    )
    env.saturate()
    try:
        seconds, outcomes = _run_phase("saturated", stack.base_url, saturated, concurrency)
        results.saturated_seconds = seconds
        results.outcomes += outcomes
        assert stack.epp is not None
        results.metrics_saturated = parse_epp_metrics(stack.epp.metrics_text())
    finally:
        env.unsaturate()
    return results


def _run_phase(
    name: str, base_url: str, calls: Sequence[Call], concurrency: int
) -> tuple[float, list[Outcome]]:
    bar = ProgressBar(name, len(calls))
    began = time.monotonic()
    try:
        outcomes = asyncio.run(send_all(base_url, calls, concurrency, bar.add))
    finally:
        bar.close()
    return time.monotonic() - began, outcomes


# ---------------------------------------------------------------------------- progress


class ProgressBar:
    """One line on stderr, redrawn in place on a terminal; a line per quarter otherwise."""

    WIDTH: Final = 30
    REDRAW_S: Final = 0.1

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.counts: collections.Counter[str] = collections.Counter()
        self.done = 0
        self._began = time.monotonic()
        self._drawn_at = 0.0
        self._next_quarter = 1

    def add(self, outcome: Outcome) -> None:
        self.done += 1
        self.counts[_status_class(outcome.status)] += 1
        now = time.monotonic()
        if self.tty:
            if now - self._drawn_at >= self.REDRAW_S or self.done == self.total:
                self._drawn_at = now
                self.stream.write("\r" + self._line(now))
                self.stream.flush()
        elif self.done * 4 >= self._next_quarter * self.total:
            while self.done * 4 >= self._next_quarter * self.total:
                self._next_quarter += 1
            self.stream.write(self._line(now) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self.done:
            self.stream.write("\n")
            self.stream.flush()

    def _line(self, now: float) -> str:
        filled = self.WIDTH * self.done // max(1, self.total)
        rate = self.done / max(1e-9, now - self._began)
        return (
            f"  {self.label:<9} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done:>4}/{self.total:<4}"
            f" ok {self.counts['ok']:>4}  shed {self.counts['shed']:>3}  err {self.counts['error']:>3}"
            f"  {rate:6.1f} req/s"
        )


def _status_class(status: int) -> str:
    if status == 200:
        return "ok"
    if status == 429:
        return "shed"
    return "error"


# ---------------------------------------------------------------------------- the report


@dataclass
class EppMetrics:
    requests: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, target)
    errors: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (model, target, code)
    ready_pods: float | None = None
    avg_kv: float | None = None
    avg_queue: float | None = None


def parse_epp_metrics(text: str) -> EppMetrics:
    """The EPP's key series out of its Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    out = EppMetrics()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "inference_model_request_total":
                out.requests[(labels.get("model_name", ""), labels.get("target_model_name", ""))] = (
                    sample.value
                )
            elif sample.name == "inference_model_request_error_total":
                key = (
                    labels.get("model_name", ""),
                    labels.get("target_model_name", ""),
                    labels.get("error_code", ""),
                )
                out.errors[key] = sample.value
            elif sample.name == "inference_pool_ready_pods":
                out.ready_pods = sample.value
            elif sample.name == "inference_pool_average_kv_cache_utilization":
                out.avg_kv = sample.value
            elif sample.name == "inference_pool_average_queue_size":
                out.avg_queue = sample.value
    return out


@dataclass
class PhaseResults:
    outcomes: list[Outcome] = field(default_factory=list)
    steady_seconds: float = 0.0
    saturated_seconds: float = 0.0
    metrics_saturated: EppMetrics | None = None


@dataclass
class Report:
    results: PhaseResults
    pods: list[tuple[str, str]]  # (name, address)
    served: dict[str, dict[str, int]]  # pod -> target model -> requests the simulator accepted
    envoy_by_pod: dict[str, int]  # pod -> requests Envoy sent upstream (access log)
    envoy_entries: int
    metrics: EppMetrics
    metrics_url: str
    criticality: dict[str, str]
    splits: dict[str, tuple[tuple[str, int | None], ...]]

    def render(self) -> str:
        return "\n".join(
            [
                "",
                self._served_table(),
                "",
                self._client_table(),
                "",
                self._split_lines(),
                "",
                self._metrics_lines(),
            ]
        )

    def _served_table(self) -> str:
        names = [name for name, _ in self.pods]
        targets = sorted({t for per_pod in self.served.values() for t in per_pod})
        width = max([len("target model"), *(len(t) for t in targets)]) + 2
        col = max(12, *(len(n) + 2 for n in names), *(len(a.split(":")[0]) + 2 for _, a in self.pods))
        lines = ["Requests per pod and target model (counted by the simulators)"]
        lines.append(f"{'target model':<{width}}" + "".join(f"{n:>{col}}" for n in names) + f"{'total':>8}")
        lines.append(f"{'':<{width}}" + "".join(f"{a.split(':')[0]:>{col}}" for _, a in self.pods))
        for target in targets:
            row = [self.served.get(n, {}).get(target, 0) for n in names]
            lines.append(f"{target:<{width}}" + "".join(f"{v:>{col}}" for v in row) + f"{sum(row):>8}")
        totals = [sum(self.served.get(n, {}).values()) for n in names]
        lines.append(f"{'total':<{width}}" + "".join(f"{v:>{col}}" for v in totals) + f"{sum(totals):>8}")
        envoy = [self.envoy_by_pod.get(n, 0) for n in names]
        lines.append(
            f"{'Envoy access log':<{width}}" + "".join(f"{v:>{col}}" for v in envoy) + f"{sum(envoy):>8}"
        )
        lines.append(
            f"(Envoy logged {self.envoy_entries} requests: {sum(envoy)} sent to a pod,"
            f" {self.envoy_entries - sum(envoy)} never reached one (shed or rejected by the EPP))"
        )
        return "\n".join(lines)

    def _client_table(self) -> str:
        rows: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for o in self.results.outcomes:
            counter = rows[(o.call.model, o.call.phase)]
            counter["sent"] += 1
            counter[_status_class(o.status)] += 1
            if o.status not in (200, 429):
                counter[f"http {o.status}" if o.status else "no response"] += 1
        models = list(dict.fromkeys(o.call.model for o in self.results.outcomes))
        width = max(len("requested model"), *(len(m) for m in models)) + 2
        lines = ["Requests per requested model (the client's view, through Envoy)"]
        lines.append(
            f"{'requested model':<{width}}{'criticality':<13}{'phase':<11}{'sent':>6}{'ok':>6}"
            f"{'shed 429':>10}{'errors':>8}"
        )
        for phase in ("steady", "saturated"):
            for model in models:
                c = rows.get((model, phase))
                if c is None:
                    continue
                detail = ", ".join(f"{k} x{v}" for k, v in c.items() if k.startswith(("http", "no ")))
                lines.append(
                    f"{model:<{width}}{self.criticality.get(model, '?'):<13}{phase:<11}{c['sent']:>6}"
                    f"{c['ok']:>6}{c['shed']:>10}{c['error']:>8}" + (f"  ({detail})" if detail else "")
                )
        r = self.results
        steady = [o for o in r.outcomes if o.call.phase == "steady"]
        streamed = sum(1 for o in r.outcomes if o.call.stream)
        chat = sum(1 for o in r.outcomes if o.call.chat)
        lines.append(
            f"{len(r.outcomes)} requests ({chat} chat, {len(r.outcomes) - chat} completions,"
            f" {streamed} streamed);"
            f" steady phase {len(steady) / max(r.steady_seconds, 1e-9):.0f} req/s"
        )
        return "\n".join(lines)

    def _split_lines(self) -> str:
        lines = ["Weighted splits (configured vs served)"]
        for model, targets in self.splits.items():
            if len(targets) < 2:
                continue
            served = {t: sum(per_pod.get(t, 0) for per_pod in self.served.values()) for t, _ in targets}
            total_served = sum(served.values()) or 1
            total_weight = sum(w or 1 for _, w in targets)
            parts = [
                f"{t} {100 * (w or 1) / total_weight:.0f}% vs {100 * served[t] / total_served:.0f}%"
                for t, w in targets
            ]
            lines.append(f"  {model}: " + "; ".join(parts) + f"  ({sum(served.values())} requests)")
        return "\n".join(lines)

    def _metrics_lines(self) -> str:
        m, sat = self.metrics, self.results.metrics_saturated
        lines = [f"EPP metrics ({self.metrics_url})", "  inference_model_request_total"]
        for (model, target), value in sorted(m.requests.items()):
            lines.append(f"    {model:<34} -> {target:<34} {value:>6.0f}")
        lines.append("  inference_model_request_error_total")
        if not m.errors:
            lines.append("    (none)")
        for (model, target, code), value in sorted(m.errors.items()):
            lines.append(f"    {model:<34} -> {target or '-':<34} {value:>6.0f}  error_code={code}")
        lines.append(f"  inference_pool_ready_pods                       {_num(m.ready_pods)}")
        lines.append(
            f"  inference_pool_average_kv_cache_utilization     {_num(m.avg_kv, '.2f')} now, "
            f"{_num(sat.avg_kv if sat else None, '.2f')} while saturated"
        )
        lines.append(
            f"  inference_pool_average_queue_size               {_num(m.avg_queue)} now, "
            f"{_num(sat.avg_queue if sat else None)} while saturated"
        )
        return "\n".join(lines)


def _num(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _collect(env: DemoEnvironment, results: PhaseResults) -> Report:
    stack = env.running_stack
    bed, epp, envoy = stack.bed, stack.epp, stack.envoy
    assert bed is not None
    assert epp is not None
    assert envoy is not None
    pods = [(name, f"{pod.ip}:{SIM_PORT}") for name, pod in sorted(bed.pods.items())]
    by_address = {address: name for name, address in pods}
    answered = sum(1 for o in results.outcomes if o.status != CONNECTION_ERROR)

    def flushed() -> list[dict[str, Any]]:
        entries = envoy.access_log()
        assert len(entries) >= answered, f"{len(entries)}/{answered} access log entries"
        return entries

    try:
        entries = eventually(flushed, timeout=ACCESS_LOG_TIMEOUT_S, message="Envoy flushed its access log")
    except AssertionError:
        entries = envoy.access_log()
    envoy_by_pod = collections.Counter(by_address.get(str(e.get("upstream_host")), "?") for e in entries)
    envoy_by_pod.pop("?", None)
    return Report(
        results=results,
        pods=pods,
        served={name: bed.pods[name].sim(SIM_PORT).requests_by_model for name, _ in pods},
        envoy_by_pod=dict(envoy_by_pod),
        envoy_entries=len(entries),
        metrics=parse_epp_metrics(epp.metrics_text()),
        metrics_url=f"{epp.metrics_url}/metrics",
        criticality={m.model_name: m.criticality or "Standard" for m in env.models},
        splits={m.model_name: m.targets for m in env.models},
    )


# ---------------------------------------------------------------------------- signals and output


def _no_children_left() -> bool:
    """True when this process has no child left running; otherwise say which survived."""
    left = child_processes()
    for child in left:
        print(f"error: process {child.pid} is still running: {child.command}", file=sys.stderr)
    return not left


def _say(text: str) -> None:
    print(text, flush=True)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_raise_interrupt() -> Iterator[None]:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt inside the block; handlers restored after.

    SIGINT gets Python's own handler even when it was inherited as ignored (a background job of a
    script), so ``asyncio.run`` still turns it into a clean cancellation.
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """While stopping: Ctrl-C/SIGTERM print a note instead of abandoning children half-stopped."""

    def note(signum: int, frame: FrameType | None) -> None:
        print("still stopping (bounded by each process's stop timeout) ...", file=sys.stderr, flush=True)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, note)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
