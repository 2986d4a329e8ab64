"""Turn one /metrics page into a new `Metrics` snapshot (pure: no I/O, no clock).

Rules (epp-behaviour.md §4.1, §4.3, §4.4, with DESIGN.md's fallback):
- Each field is parsed independently. A missing family adds an error and leaves that field as it was
  in `previous`, while the other fields still update (upstream #495/#561: vLLM v1 without LoRA has
  no `lora_requests_info`, and one absent family must not freeze queue and KV forever).
- Gauges: among the series matching the spec's labels, the one with the greatest exposition
  timestamp wins, else the first (vLLM writes no timestamps).
- KV usage: `kv_cache_usage` (default `vllm:kv_cache_usage_perc`); when that family is absent,
  `kv_cache_usage_fallback` (`vllm:gpu_cache_usage_perc`, older vLLM).
- LoRA: the `lora_info` series with the largest value (vLLM sets it to the time the state was
  entered) wins; series whose running and waiting labels are both empty are skipped, and when none
  remains the adapters are kept as they were (#423). Adapter lists are split on commas; unlike
  upstream, names are stripped and empty names dropped, since a name with spaces can never match a
  model. `max_lora` is the server's configuration, the same on every series, so it is read from the
  newest series even when that one lists no adapters (upstream skipped those, so a pod that had
  never run an adapter looked unable to load one). A `max_lora` that is not an integer adds an error
  and leaves the field unchanged.
- Non-finite gauge values (NaN, ±Inf) are errors: one NaN must not poison the scheduler's ordering.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from epp.backend.metrics.exposition import Series, find_series
from epp.backend.metrics.spec import MetricSpec, parse_metric_spec
from epp.config import MetricNames
from epp.datastore.types import Metrics

LORA_RUNNING_LABEL = "running_lora_adapters"
LORA_WAITING_LABEL = "waiting_lora_adapters"
LORA_MAX_LABEL = "max_lora"


@dataclass(frozen=True, slots=True)
class MetricPlan:
    """The parsed metric-name flags; None disables a field."""

    queued_requests: MetricSpec | None
    running_requests: MetricSpec | None
    kv_cache_usage: MetricSpec | None
    kv_cache_usage_fallback: MetricSpec | None
    lora_info: MetricSpec | None


@dataclass(frozen=True, slots=True)
class ParseResult:
    metrics: Metrics
    errors: list[str]
    # How many metric families were found on the page; 0 with errors means nothing was learnt, and
    # the refresher then keeps the old snapshot (and its age) instead of claiming fresh data.
    families_found: int


@functools.lru_cache(maxsize=16)
def compile_metric_names(names: MetricNames) -> MetricPlan:
    """Parse every flag once; ValueError names the offending field. The entry point calls this first."""
    specs: dict[str, MetricSpec | None] = {}
    for field in (
        "queued_requests",
        "running_requests",
        "kv_cache_usage",
        "kv_cache_usage_fallback",
        "lora_info",
    ):
        try:
            specs[field] = parse_metric_spec(getattr(names, field))
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}") from None
    return MetricPlan(**specs)


def parse(text: str, names: MetricNames, previous: Metrics, now: float) -> tuple[Metrics, list[str]]:
    """The new snapshot (built from `previous`, `updated_at = now`) and the errors met on the way."""
    result = parse_page(text, compile_metric_names(names), previous, now)
    return result.metrics, result.errors


def parse_page(text: str, plan: MetricPlan, previous: Metrics, now: float) -> ParseResult:
    scan = _Scanner(text)
    errors: list[str] = []
    found = 0

    waiting = previous.waiting_queue_size
    if plan.queued_requests is not None:
        value = scan.gauge(plan.queued_requests, errors)
        if value is not None:
            found += 1
            waiting = _as_int(value, plan.queued_requests, errors, waiting)

    running = previous.running_queue_size
    if plan.running_requests is not None:
        value = scan.gauge(plan.running_requests, errors)
        if value is not None:
            found += 1
            running = _as_int(value, plan.running_requests, errors, running)

    kv = previous.kv_cache_usage
    if plan.kv_cache_usage is not None:
        spec = plan.kv_cache_usage
        fallback = plan.kv_cache_usage_fallback
        if fallback is not None and not scan.has(spec.name) and scan.has(fallback.name):
            spec = fallback
        value = scan.gauge(spec, errors)
        if value is not None:
            found += 1
            kv = _as_float(value, spec, errors, kv)

    active = previous.active_models
    waiting_models = previous.waiting_models
    max_lora = previous.max_active_models
    if plan.lora_info is not None:
        series = scan.series(plan.lora_info.name, errors)
        if series:
            found += 1
            newest = _latest_lora(series, plan.lora_info, require_adapters=False)
            if newest is not None:
                max_lora = _max_lora(newest.labels.get(LORA_MAX_LABEL, ""), errors, max_lora)
            best = _latest_lora(series, plan.lora_info, require_adapters=True)
            if best is not None:
                active = _adapters(best.labels.get(LORA_RUNNING_LABEL, ""))
                waiting_models = _adapters(best.labels.get(LORA_WAITING_LABEL, ""))

    metrics = Metrics(
        waiting_queue_size=waiting,
        running_queue_size=running,
        kv_cache_usage=kv,
        active_models=active,
        waiting_models=waiting_models,
        max_active_models=max_lora,
        updated_at=now,
    )
    return ParseResult(metrics, errors, found)


class _Scanner:
    """Looks each name up at most once per page (KV and its fallback may probe the same name)."""

    __slots__ = ("_cache", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._cache: dict[str, list[Series] | str] = {}

    def _lookup(self, name: str) -> list[Series] | str:
        hit = self._cache.get(name)
        if hit is None:
            try:
                hit = find_series(self._text, name)
            except ValueError as exc:
                hit = str(exc)
            self._cache[name] = hit
        return hit

    def has(self, name: str) -> bool:
        return bool(self._lookup(name))

    def series(self, name: str, errors: list[str]) -> list[Series]:
        hit = self._lookup(name)
        if isinstance(hit, str):
            errors.append(hit)
            return []
        if not hit:
            errors.append(f'metric family "{name}" not found')
        return hit

    def gauge(self, spec: MetricSpec, errors: list[str]) -> float | None:
        """The chosen series' value; None (with an error) when absent or nothing matches."""
        series = self.series(spec.name, errors)
        if not series:
            return None
        best: Series | None = None
        best_ts = 0.0
        for s in series:
            if spec.labels and not spec.matches(s.labels):
                continue
            ts = s.timestamp_ms if s.timestamp_ms is not None else 0.0
            if best is None or ts > best_ts:
                best, best_ts = s, ts
        if best is None:
            errors.append(f'metric "{spec}": no series matches the listed labels')
            return None
        return best.value


def _latest_lora(series: list[Series], spec: MetricSpec, *, require_adapters: bool) -> Series | None:
    best: Series | None = None
    best_value = -math.inf
    for s in series:
        if spec.labels and not spec.matches(s.labels):
            continue
        if require_adapters and not s.labels.get(LORA_RUNNING_LABEL) and not s.labels.get(LORA_WAITING_LABEL):
            continue
        value = s.value if not math.isnan(s.value) else -math.inf
        if best is None or value > best_value:
            best, best_value = s, value
    return best


def _adapters(label: str) -> frozenset[str]:
    if not label:
        return frozenset()
    return frozenset(name for part in label.split(",") if (name := part.strip()))


def _max_lora(label: str, errors: list[str], previous: int) -> int:
    if not label:
        return previous
    if label.isascii() and label.isdigit():
        return int(label)
    errors.append(f"label {LORA_MAX_LABEL}={label!r} is not an integer")
    return previous


def _as_int(value: float, spec: MetricSpec, errors: list[str], previous: int) -> int:
    if not math.isfinite(value):
        errors.append(f'metric "{spec}" has non-finite value {value}')
        return previous
    return int(value)


def _as_float(value: float, spec: MetricSpec, errors: list[str], previous: float) -> float:
    if not math.isfinite(value):
        errors.append(f'metric "{spec}" has non-finite value {value}')
        return previous
    return value
