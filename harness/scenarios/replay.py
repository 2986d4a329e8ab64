"""`harness replay SCENARIO.yaml`: reproduce a reconciler bug without writing Python.

Each step is applied to a fresh control plane (or `--kubeconfig`'s cluster, in a fresh namespace)
with the real EPP running; after each step the runner settles (the EPP has applied the step's writes
and is idle: `harness.verdicts.settle`), waits for the datastore to agree with the API server, and prints the
datastore view, the oracle's verdict and, for requests, the chosen endpoint. Settling first is what
makes an expectation such as `pods: [p2]` after a write that must change nothing a real check.
Exit 0 when every step converged and met its expectations; 1 at the first step that diverged
(named in the output); 2 for a malformed scenario.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client

from harness.beds.testbed import TestBed
from harness.cluster.controlplane import ClusterAccess, ControlPlane
from harness.cluster.namespaces import create_namespace
from harness.dataplane.extproc_client import ExtProcResult
from harness.scenarios.scenario import ACTIONS, Scenario, ScenarioError, Step, check_expectations, load

HELP = "apply a YAML scenario step by step against a real API server and EPP, checking consistency"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", type=Path, help="the scenario file (see examples/)")
    parser.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting one")
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds a step may take to converge")


def run(args: argparse.Namespace) -> int:
    try:
        scenario = load(args.scenario)
    except (OSError, ScenarioError) as exc:
        print(f"harness replay: {exc}", file=sys.stderr)
        return 2
    with _cluster(args.kubeconfig) as access:
        return replay(scenario, access, timeout=args.timeout)


@contextlib.contextmanager
def _cluster(kubeconfig: Path | None) -> Iterator[ClusterAccess]:
    if kubeconfig is not None:
        yield ClusterAccess.from_kubeconfig(kubeconfig)
        return
    print("starting the control plane ...", flush=True)
    with ControlPlane() as plane:
        yield plane.access


def replay(
    scenario: Scenario, access: ClusterAccess, *, timeout: float = 15.0, out: TextIO = sys.stdout
) -> int:
    namespace = f"replay-{uuid.uuid4().hex[:8]}"
    api = access.api_client()
    try:
        create_namespace(api, namespace)
        with TestBed(api, namespace, access.kubeconfig_path) as bed:
            bed.start_epp()
            print(f"scenario: {scenario.name}  (namespace {namespace})", file=out)
            for step in scenario.steps:
                problems = _run_step(bed, step, timeout, out)
                if problems:
                    print(f"\nDIVERGED at step {step.index} ({step.describe()}):", file=out)
                    for problem in problems:
                        print(f"  - {problem}", file=out)
                    return 1
            print(f"\nall {len(scenario.steps)} steps consistent", file=out)
            return 0
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _run_step(bed: TestBed, step: Step, timeout: float, out: TextIO) -> list[str]:
    print(f"\n[{step.index}] {step.describe()}" + (f"  # {step.note}" if step.note else ""), file=out)
    try:
        result = ACTIONS[step.action](bed, step.args)
    except (AssertionError, ScenarioError, client.ApiException) as exc:
        return [f"the step itself failed: {_one_line(exc)}"]
    problems: list[str] = []
    try:
        bed.settled(timeout=timeout)
    except AssertionError as exc:
        problems.append(f"the EPP did not settle: {_one_line(exc)}")
    try:
        verdict = bed.verdict() if problems else bed.eventually_consistent(timeout=timeout)
    except AssertionError:
        verdict = bed.verdict()
    print(f"    datastore: {_summarise(bed.epp.datastore_view())}", file=out)
    print(f"    oracle:    {verdict.summary()}", file=out)
    if result is not None:
        print(f"    request:   {_describe(bed, result)}", file=out)
    if not verdict.consistent:
        problems.append(verdict.summary())
    return problems + check_expectations(bed, step, result)


def _describe(bed: TestBed, result: ExtProcResult) -> str:
    if result.status != 200:
        return f"status {result.status}: {result.message.strip()}"
    return f"routed to {result.endpoint} (pod {bed.pod_for_endpoint(result.endpoint)})"


def _summarise(view: dict[str, Any]) -> str:
    pool = view.get("pool")
    pool_text = (
        "none" if not pool else f"{pool['name']} port {pool['targetPortNumber']} selector {pool['selector']}"
    )
    pods = ", ".join(_pod_text(p) for p in view.get("pods") or ())
    models = ", ".join(f"{m['modelName']}<-{m['name']}" for m in view.get("models") or ())
    return f"pool {pool_text}; pods [{pods}]; models [{models}]"


def _pod_text(pod: dict[str, Any]) -> str:
    metrics = pod["metrics"]
    queue, kv = metrics["waitingQueueSize"], metrics["kvCacheUsagePercent"]
    return f"{pod['name']}@{pod['address']} q={queue} kv={kv:.2f}"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
