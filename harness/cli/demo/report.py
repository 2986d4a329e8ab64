"""The demo's report: requests per pod and target model (as the simulators counted them, with Envoy's
access log as a cross-check), the client's view per requested model and phase, the weighted splits,
and the EPP's own metrics. Tables come from ``harness.cli.console``."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.base.eventually import eventually
from harness.cli.console import Column, table_text
from harness.cli.demo.environment import SIM_PORT, DemoEnvironment
from harness.cli.demo.load import CONNECTION_ERROR, Outcome, status_class
from harness.cluster.releases import session_generation

ACCESS_LOG_TIMEOUT_S = 15.0


@dataclass
class EppMetrics:
    requests: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, target)
    errors: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (model, target, code)
    ready_pods: float | None = None
    avg_kv: float | None = None
    avg_queue: float | None = None


def request_metrics() -> str:
    """The per-request metrics' prefix of the session's generation (``inference_model``, in v1
    ``inference_objective``)."""
    return session_generation().request_metrics


def parse_epp_metrics(text: str) -> EppMetrics:
    """The EPP's key series out of its Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    out = EppMetrics()
    prefix = request_metrics()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == f"{prefix}_request_total":  # v1 also splits it by priority: summed
                pair = (labels.get("model_name", ""), labels.get("target_model_name", ""))
                out.requests[pair] = out.requests.get(pair, 0.0) + sample.value
            elif sample.name == f"{prefix}_request_error_total":
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
    # What the EPP's datastore showed per pod when the saturated phase started (real load).
    saturation_seen: list[dict[str, Any]] = field(default_factory=list)
    metrics_saturated: EppMetrics | None = None
    background_in_flight: int = 0


@dataclass
class Report:
    results: PhaseResults
    pods: list[tuple[str, str]]  # (name, address)
    served: dict[str, dict[str, int]]  # pod -> target model -> requests the simulator accepted
    envoy_by_pod: dict[str, int]  # pod -> requests Envoy sent upstream (access log)
    envoy_entries: int
    # Of those sent upstream, the ones the client cancelled before the pod answered (no response
    # code): the background load ended at the end of the saturated phase. One cancelled while its
    # bytes were still on the way was never accepted by the pod, so the simulators' total may be
    # short of Envoy's by at most this many.
    envoy_cancelled: int
    metrics: EppMetrics
    metrics_url: str
    criticality: dict[str, str]
    splits: dict[str, tuple[tuple[str, int | None], ...]]
    background_model: str = ""

    def render(self) -> str:
        return "\n".join(
            [
                "",
                self._served_table(),
                self._client_table(),
                self._split_lines(),
                "",
                self._metrics_lines(),
            ]
        )

    def _served_table(self) -> str:
        names = [name for name, _ in self.pods]
        targets = sorted({t for per_pod in self.served.values() for t in per_pod})
        columns = [Column("target model", "left"), *(Column(n) for n in names), Column("total")]
        rows = [["", *(address.split(":")[0] for _, address in self.pods), ""]]
        for target in targets:
            row = [self.served.get(n, {}).get(target, 0) for n in names]
            rows.append([target, *map(str, row), str(sum(row))])
        totals = [sum(self.served.get(n, {}).values()) for n in names]
        rows.append(["total", *map(str, totals), str(sum(totals))])
        envoy = [self.envoy_by_pod.get(n, 0) for n in names]
        rows.append(["Envoy access log", *map(str, envoy), str(sum(envoy))])
        caption = (
            f"(Envoy logged {self.envoy_entries} requests: {sum(envoy)} sent to a pod, of which"
            f" {self.envoy_cancelled} cancelled by the client before the pod answered (the background"
            f" load at the end); {self.envoy_entries - sum(envoy)} never reached one (shed or rejected"
            " by the EPP))"
        )
        return table_text(
            "Requests per pod and target model (counted by the simulators)", columns, rows, caption
        )

    def _client_table(self) -> str:
        counts: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for o in self.results.outcomes:
            counter = counts[(o.call.model, o.call.phase)]
            counter["sent"] += 1
            counter[status_class(o.status)] += 1
            if o.status not in (200, 429):
                counter[f"http {o.status}" if o.status != CONNECTION_ERROR else "no response"] += 1
        models = list(dict.fromkeys(o.call.model for o in self.results.outcomes))
        columns = [
            Column("requested model", "left"),
            Column("criticality", "left"),
            Column("phase", "left"),
            Column("sent"),
            Column("ok"),
            Column("shed 429"),
            Column("errors"),
            Column("detail", "left"),
        ]
        rows: list[list[str]] = []
        for phase in ("steady", "saturated"):
            for model in models:
                c = counts.get((model, phase))
                if c is None:
                    continue
                detail = ", ".join(f"{k} x{v}" for k, v in c.items() if k.startswith(("http", "no ")))
                rows.append(
                    [
                        model,
                        self.criticality.get(model, "?"),
                        phase,
                        str(c["sent"]),
                        str(c["ok"]),
                        str(c["shed"]),
                        str(c["error"]),
                        detail,
                    ]
                )
        r = self.results
        steady = [o for o in r.outcomes if o.call.phase == "steady"]
        streamed = sum(1 for o in r.outcomes if o.call.stream)
        chat = sum(1 for o in r.outcomes if o.call.chat)
        caption = (
            f"{len(r.outcomes)} requests ({chat} chat, {len(r.outcomes) - chat} completions,"
            f" {streamed} streamed); steady phase {len(steady) / max(r.steady_seconds, 1e-9):.0f} req/s;"
            f" the saturated phase ran beside {r.background_in_flight} background {self.background_model}"
            " requests (not counted here)"
        )
        return table_text(
            "Requests per requested model (the client's view, through Envoy)", columns, rows, caption
        )

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
        prefix = request_metrics()
        lines = [f"EPP metrics ({self.metrics_url})", f"  {prefix}_request_total"]
        for (model, target), value in sorted(m.requests.items()):
            lines.append(f"    {model:<34} -> {target:<34} {value:>6.0f}")
        lines.append(f"  {prefix}_request_error_total")
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


def saturation_text(seen: Sequence[dict[str, Any]]) -> str:
    """One line: what the EPP scraped from each pod when it started shedding."""
    parts = [f"{m['waitingQueueSize']} waiting / KV {m['kvCacheUsagePercent']:.1%}" for m in seen]
    return "; ".join(parts)


def collect(env: DemoEnvironment, results: PhaseResults, background_model: str) -> Report:
    stack = env.running_stack
    cluster, envoy = stack.cluster, stack.envoy
    assert cluster is not None
    assert envoy is not None
    pods = [(name, f"{pod.ip}:{SIM_PORT}") for name, pod in sorted(cluster.pods.items())]
    by_address = {address: name for name, address in pods}
    served = {name: cluster.pods[name].sim(SIM_PORT).requests_by_model() for name, _ in pods}
    reached = sum(sum(per_pod.values()) for per_pod in served.values())

    def flushed() -> list[dict[str, Any]]:
        # Every request a simulator accepted went through Envoy: wait until its entry is written
        # (the background requests cancelled at the end of the saturated phase are logged last).
        entries = envoy.access_log()
        upstream = sum(1 for e in entries if str(e.get("upstream_host")) in by_address)
        assert upstream >= reached, f"{upstream}/{reached} access log entries with a pod"
        return entries

    try:
        entries = eventually(flushed, timeout=ACCESS_LOG_TIMEOUT_S, message="Envoy flushed its access log")
    except AssertionError:
        entries = envoy.access_log()
    sent = [e for e in entries if str(e.get("upstream_host")) in by_address]
    envoy_by_pod = collections.Counter(by_address[str(e.get("upstream_host"))] for e in sent)
    cancelled = sum(1 for e in sent if str(e.get("status")) == "0")
    return Report(
        results=results,
        pods=pods,
        served=served,
        envoy_by_pod=dict(envoy_by_pod),
        envoy_entries=len(entries),
        envoy_cancelled=cancelled,
        metrics=parse_epp_metrics(stack.epp_metrics_text()),
        metrics_url=f"{stack.epp_metrics_url}/metrics",
        criticality={m.model_name: m.criticality or "Standard" for m in env.models},
        splits={m.model_name: m.targets for m in env.models},
        background_model=background_model,
    )
