"""Declarative reconciler scenarios: a YAML list of steps applied to a `TestBed`, one at a time.

The format (documented in the README) is a mapping with `name`, optional `description`, and `steps`;
each step has exactly one action key, an optional `expect`, and an optional `note`:

    - apply_pool: {selector: {app: vllm}, port: 8000}
    - add_pod: {name: p1, labels: {app: vllm}}
    - request: {model: chat}
      expect: {status: 200, pod: p1}

Parsing is strict (unknown keys are errors, naming the step) so a typo never silently skips a step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.beds.testbed import TestBed
from harness.dataplane.extproc_client import ExtProcResult
from harness.verdicts.settle import DEFAULT_TIMEOUT as DEFAULT_SETTLE_TIMEOUT
from harness.verdicts.settle import MODELS, PODS, POOLS

Action = Callable[[TestBed, Any], ExtProcResult | None]
GAUGE_KEYS = ("waiting", "running", "kv_cache", "running_loras", "waiting_loras", "max_lora")
EXPECT_KEYS = frozenset({"status", "pod", "pod_in", "target_model", "pods", "models", "health"})


class ScenarioError(ValueError):
    """The scenario file is malformed; the message names the step."""


@dataclass(frozen=True)
class Step:
    index: int
    action: str
    args: Any
    expect: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    def describe(self) -> str:
        args = self.args if isinstance(self.args, str) else yaml.safe_dump(self.args, default_flow_style=True)
        return f"{self.action} {str(args).strip()}".strip()


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: Sequence[Step]
    description: str = ""


def load(path: Path) -> Scenario:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(doc, Mapping) or not isinstance(doc.get("steps"), list) or not doc["steps"]:
        raise ScenarioError(f"{path}: expected a mapping with a non-empty 'steps' list")
    unknown = set(doc) - {"name", "description", "steps"}
    if unknown:
        raise ScenarioError(f"{path}: unknown top-level keys {sorted(unknown)}")
    steps = [_parse_step(i, raw) for i, raw in enumerate(doc["steps"], start=1)]
    return Scenario(str(doc.get("name", path.stem)), steps, str(doc.get("description", "")))


def _parse_step(index: int, raw: Any) -> Step:
    if isinstance(raw, str):
        raw = {raw: None}
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"step {index}: expected a mapping, got {raw!r}")
    actions = [k for k in raw if k not in ("expect", "note")]
    if len(actions) != 1 or actions[0] not in ACTIONS:
        raise ScenarioError(
            f"step {index}: exactly one action expected, one of {sorted(ACTIONS)}; got {sorted(actions)}"
        )
    expect = raw.get("expect") or {}
    if not isinstance(expect, Mapping) or set(expect) - EXPECT_KEYS:
        raise ScenarioError(f"step {index}: 'expect' takes {sorted(EXPECT_KEYS)}")
    action, args = actions[0], raw[actions[0]]
    _check_args(index, action, args)
    return Step(index, action, args, dict(expect), str(raw.get("note", "")))


def _check_args(index: int, action: str, args: Any) -> None:
    """Reject malformed arguments at load time, before any cluster is started."""
    allowed = ARGUMENTS.get(action)
    where = f"step {index} ({action})"
    if allowed is None:  # takes an object name
        if action in ("restart_epp", "delete_pool") and not args:
            return
        _name(args, where)
        return
    if args is not None and not isinstance(args, Mapping):
        raise ScenarioError(f"{where}: expected a mapping of {sorted(allowed)}")
    _opts(args, allowed, where)
    if action == "gauges" and "pod" not in (args or {}):
        raise ScenarioError(f"{where}: needs 'pod'")
    if action == "settle":
        _check_settle_at((args or {}).get("at"), where)


def _check_settle_at(at: Any, where: str) -> None:
    if at is None:
        return
    kinds = {POOLS, MODELS, PODS}
    if not isinstance(at, Mapping) or set(at) - kinds:
        raise ScenarioError(f"{where}: 'at' maps kinds {sorted(kinds)} to resourceVersions")
    for kind, version in at.items():
        if not str(version).isdigit():
            raise ScenarioError(f"{where}: 'at.{kind}' must be a resourceVersion (digits), got {version!r}")


# ---------------------------------------------------------------------- actions
def _name(arg: Any, step: str) -> str:
    if isinstance(arg, str):
        return arg
    if isinstance(arg, Mapping) and isinstance(arg.get("name"), str):
        return str(arg["name"])
    raise ScenarioError(f"{step}: needs a pod or object name")


def _opts(arg: Any, allowed: set[str], step: str) -> dict[str, Any]:
    opts = dict(arg or {})
    extra = set(opts) - allowed
    if extra:
        raise ScenarioError(f"{step}: unknown keys {sorted(extra)} (allowed: {sorted(allowed)})")
    return opts


def _apply_pool(bed: TestBed, arg: Any) -> None:
    o = _opts(arg, ARGUMENTS["apply_pool"], "apply_pool")
    bed.apply_pool(o.get("selector"), int(o.get("port", 8000)), o.get("name"))


def _delete_pool(bed: TestBed, arg: Any) -> None:
    bed.delete_pool(arg if isinstance(arg, str) else (arg or {}).get("name"))


def _apply_model(bed: TestBed, arg: Any) -> None:
    o = _opts(arg, ARGUMENTS["apply_model"], "apply_model")
    targets = [(str(t["name"]), t.get("weight")) for t in o.get("targets") or ()]
    bed.apply_model(
        _name(o, "apply_model"),
        o.get("modelName"),
        criticality=o.get("criticality"),
        targets=targets,
        pool=o.get("pool"),
        namespace=o.get("namespace"),
    )


def _add_pod(bed: TestBed, arg: Any) -> None:
    o = _opts(arg, ARGUMENTS["add_pod"], "add_pod")
    pre_stop = o.get("pre_stop")
    bed.add_pod(
        _name(o, "add_pod"),
        o.get("labels"),
        ready=bool(o.get("ready", True)),
        pre_stop=None if pre_stop is None else int(pre_stop),
    )


def _add_forged_pod(bed: TestBed, arg: Any) -> None:
    o = _opts(arg, ARGUMENTS["add_forged_pod"], "add_forged_pod")
    bed.add_forged_pod(_name(o, "add_forged_pod"), o.get("labels"), ready=bool(o.get("ready", True)))


def _pod_labels(bed: TestBed, arg: Any) -> None:
    o = _opts(arg, ARGUMENTS["pod_labels"], "pod_labels")
    bed.pod_labels(_name(o, "pod_labels"), o.get("labels") or {})


def _gauges(bed: TestBed, arg: Any) -> None:
    o = _opts(arg, ARGUMENTS["gauges"], "gauges")
    pod = str(o.pop("pod"))
    bed.set_gauges(pod, **o)
    bed.eventually_gauges(pod, **o)


def _settle(bed: TestBed, arg: Any) -> None:
    """No write: wait for the barrier (every step does after its action; this step does only that),
    also for resourceVersions written outside the scenario (`at`, e.g. with kubectl on --kubeconfig's
    cluster), then check the step's `expect`."""
    o = _opts(arg, ARGUMENTS["settle"], "settle")
    bed.settled(at=o.get("at"), timeout=float(o.get("timeout", DEFAULT_SETTLE_TIMEOUT)))


def _request(bed: TestBed, arg: Any) -> ExtProcResult:
    """Route one request through the EPP, once it has scraped every pod it holds (a pod added by the
    step before may not have been: the decision would then be about freshness, not about the step)."""
    o = _opts(arg, ARGUMENTS["request"], "request")
    bed.eventually_scraped()
    body = o.get("body")
    return bed.route(
        o.get("model"),
        str(o.get("prompt", "hello")),
        body=body.encode() if isinstance(body, str) else None,
        chunks=int(o.get("chunks", 1)),
        bodyless=bool(o.get("bodyless", False)),
    )


def _simple(method: Callable[[TestBed, str], object]) -> Action:
    def act(bed: TestBed, arg: Any) -> None:
        method(bed, _name(arg, method.__name__))

    return act


# Keys each mapping-style action accepts; actions absent here take an object name.
ARGUMENTS: dict[str, set[str]] = {
    "apply_pool": {"name", "selector", "port"},
    "apply_model": {"name", "modelName", "criticality", "targets", "pool", "namespace"},
    "add_pod": {"name", "labels", "ready", "pre_stop"},
    "add_forged_pod": {"name", "labels", "ready"},
    "pod_labels": {"name", "labels"},
    "gauges": {"pod", *GAUGE_KEYS},
    "request": {"model", "prompt", "chunks", "body", "bodyless"},
    "settle": {"at", "timeout"},
}

ACTIONS: dict[str, Action] = {
    "apply_pool": _apply_pool,
    "delete_pool": _delete_pool,
    "apply_model": _apply_model,
    "delete_model": _simple(TestBed.delete_model),
    # pods the node agent runs, changed the way a cluster changes them
    "add_pod": _add_pod,
    "pod_ready": _simple(TestBed.pod_ready),
    "pod_unready": _simple(TestBed.pod_unready),
    "pod_labels": _pod_labels,
    "pod_terminate": _simple(TestBed.terminate_pod),
    "pod_delete": _simple(TestBed.delete_pod),
    "pod_force_delete": _simple(TestBed.force_delete_pod),
    "pod_recreate": _simple(TestBed.pod_recreate),
    "pod_kill": _simple(TestBed.kill_container),
    # forged pods: states no kubelet produces, for bugs that need them
    "add_forged_pod": _add_forged_pod,
    "forged_ready": _simple(TestBed.forged_ready),
    "forged_unready": _simple(TestBed.forged_unready),
    "forged_pod_ip": _simple(TestBed.forged_move),
    "forged_finalize": _simple(TestBed.forged_hold_and_delete),
    "forged_release": _simple(TestBed.forged_release),
    "gauges": _gauges,
    "request": _request,
    "restart_epp": lambda bed, _: bed.restart_epp(),
    "settle": _settle,
}


# ---------------------------------------------------------------------- expectations
def check_expectations(bed: TestBed, step: Step, result: ExtProcResult | None) -> list[str]:
    """Return what did not hold (empty: all good)."""
    exp, problems = step.expect, []
    if result is not None:
        chosen = bed.pod_for_endpoint(result.endpoint)
        if "status" in exp and result.status != int(exp["status"]):
            problems.append(f"status {result.status} ({result.message}), expected {exp['status']}")
        if "pod" in exp and chosen != exp["pod"]:
            problems.append(f"routed to {chosen}, expected {exp['pod']}")
        if "pod_in" in exp and chosen not in exp["pod_in"]:
            problems.append(f"routed to {chosen}, expected one of {exp['pod_in']}")
        if "target_model" in exp:
            import json

            model = json.loads(result.body)["model"] if result.body else None
            if model != exp["target_model"]:
                problems.append(f"target model {model}, expected {exp['target_model']}")
    if "pods" in exp or "models" in exp:
        view = bed.epp.datastore_view()
        pods = sorted(p["name"] for p in view.get("pods") or ())
        if "pods" in exp and pods != sorted(exp["pods"]):
            problems.append(f"datastore pods {pods}, expected {sorted(exp['pods'])}")
        models = {m["modelName"]: m["name"] for m in view.get("models") or ()}
        if "models" in exp and models != dict(exp["models"]):
            problems.append(f"datastore models {models}, expected {dict(exp['models'])}")
    if "health" in exp and (health := bed.epp.health()) != exp["health"]:
        problems.append(f"health {health}, expected {exp['health']}")
    return problems
