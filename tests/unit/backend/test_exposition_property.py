"""The targeted scan agrees with `prometheus_client`'s text parser (the reference) on generated pages.

Pages mix the families the EPP reads with distractors: histograms and counters whose names share a
prefix with a wanted family, HELP/TYPE lines, comments, blank lines, several series per family,
label values full of quotes, commas, braces, backslashes and newline escapes, NaN/±Inf values and
optional timestamps.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from epp.backend.metrics.exposition import find_series
from epp.backend.metrics.parse import parse
from epp.config import MetricNames
from epp.datastore.types import Metrics

WANTED = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:lora_requests_info",
)
# Distractors sharing prefixes with the wanted names, plus unrelated ones.
OTHER_NAMES = (
    "vllm:num_requests_waiting_time",
    "vllm:num_requests",
    "vllm:kv_cache_usage_perc2",
    "vllm:lora_requests_info_extra",
    "process_cpu_seconds",
    "http_requests",
)

label_names = st.sampled_from(
    ["model_name", "le", "quantile", "running_lora_adapters", "waiting_lora_adapters", "max_lora", "x", "_y"]
)
label_values = st.one_of(
    st.text(alphabet='ab,"\\\n{}= #\t.é', max_size=12),
    st.sampled_from(["", "a1,a2", "3", "x", "lora-1"]),
)
values = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "0", "1e3", "1.5E-3"]),
)
help_texts = st.text(alphabet='ab \\"\n', max_size=10)
# Wanted families are gauges (as vLLM declares them) or untyped; `prometheus_client` renames the
# samples of a counter without `_total`, which no exporter of these names does.
WANTED_KINDS = ["gauge", "untyped", None]
OTHER_KINDS = ["gauge", "counter", "histogram", "summary"]
SUFFIXES = {
    "histogram": ["_bucket", "_sum", "_count"],
    "summary": ["", "_sum", "_count"],
    "counter": ["_total"],
}
timestamps = st.one_of(st.none(), st.integers(-(10**13), 10**13))


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def series_line(draw: st.DrawFn, name: str) -> str:
    names = draw(st.lists(label_names, unique=True, max_size=4))
    pairs = [f'{n}="{escape(draw(label_values))}"' for n in names]
    sep = draw(st.sampled_from([",", ", "]))
    labels = sep.join(pairs)
    trailing_comma, empty_braces = draw(st.booleans()), draw(st.booleans())
    if pairs and trailing_comma:
        labels += ","
    block = "{" + labels + "}" if pairs or empty_braces else ""
    line = f"{name}{block} {draw(values)}"
    ts = draw(timestamps)
    return line if ts is None else f"{line} {ts}"


@st.composite
def family(draw: st.DrawFn) -> list[str]:
    wanted = draw(st.booleans())
    name = draw(st.sampled_from(WANTED if wanted else OTHER_NAMES))
    kind = draw(st.sampled_from(WANTED_KINDS if wanted else OTHER_KINDS))
    lines: list[str] = []
    if draw(st.booleans()):
        lines.append(f"# HELP {name} " + escape(draw(help_texts)))
    if kind is not None:
        lines.append(f"# TYPE {name} {kind}")
    suffixes = SUFFIXES
    for _ in range(draw(st.integers(0, 4))):
        suffix = draw(st.sampled_from(suffixes.get(kind or "", [""])))
        lines.append(draw(series_line(name + suffix)))
    return lines


@st.composite
def pages(draw: st.DrawFn) -> str:
    lines: list[str] = []
    for fam in draw(st.lists(family(), max_size=8)):
        lines += fam
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["", "# a plain comment", "#"])))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


def same_value(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def reference_series(text: str, name: str) -> list[tuple[dict[str, str], float, float | None]]:
    return [
        (dict(s.labels), float(s.value), None if s.timestamp is None else float(s.timestamp))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


CHECKS = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@CHECKS
@given(pages())
def test_series_agree_with_reference_parser(page: str) -> None:
    for name in WANTED:
        ours = find_series(page, name)
        ref = reference_series(page, name)
        assert len(ours) == len(ref), name
        for mine, theirs in zip(ours, ref, strict=True):
            assert mine.labels == theirs[0]
            assert same_value(mine.value, theirs[1])
            ts = None if mine.timestamp_ms is None else mine.timestamp_ms / 1000
            assert ts == theirs[2]


def split(adapters: str) -> frozenset[str]:
    return frozenset(p.strip() for p in adapters.split(",") if p.strip())


def reference_metrics(text: str, previous: Metrics, now: float) -> Metrics:
    """The selection rules of epp.backend.metrics.parse, applied to the reference parser's samples."""

    def gauge(name: str) -> float | None:
        best, best_ts = None, 0.0
        for _, value, ts in reference_series(text, name):
            key = (ts or 0.0) * 1000
            if best is None or key > best_ts:
                best, best_ts = value, key
        return best

    def usable(v: float | None) -> bool:
        return v is not None and math.isfinite(v)

    waiting = gauge("vllm:num_requests_waiting")
    running = gauge("vllm:num_requests_running")
    kv_name = "vllm:kv_cache_usage_perc"
    if not reference_series(text, kv_name) and reference_series(text, "vllm:gpu_cache_usage_perc"):
        kv_name = "vllm:gpu_cache_usage_perc"
    kv = gauge(kv_name)
    every_lora = [
        (labels, -math.inf if math.isnan(v) else v)
        for labels, v, _ in reference_series(text, "vllm:lora_requests_info")
    ]
    with_adapters = [
        (labels, v)
        for labels, v in every_lora
        if labels.get("running_lora_adapters") or labels.get("waiting_lora_adapters")
    ]
    active, waiting_models = previous.active_models, previous.waiting_models
    max_lora = previous.max_active_models
    if every_lora:  # max_lora: the newest series, adapters or not; max() keeps the first of equals
        raw = max(every_lora, key=lambda lv: lv[1])[0].get("max_lora", "")
        if raw.isascii() and raw.isdigit():
            max_lora = int(raw)
    if with_adapters:
        labels = max(with_adapters, key=lambda lv: lv[1])[0]
        active = split(labels.get("running_lora_adapters", ""))
        waiting_models = split(labels.get("waiting_lora_adapters", ""))
    return Metrics(
        waiting_queue_size=int(waiting) if usable(waiting) else previous.waiting_queue_size,  # type: ignore[arg-type]
        running_queue_size=int(running) if usable(running) else previous.running_queue_size,  # type: ignore[arg-type]
        kv_cache_usage=kv if usable(kv) else previous.kv_cache_usage,  # type: ignore[arg-type]
        active_models=active,
        waiting_models=waiting_models,
        max_active_models=max_lora,
        updated_at=now,
    )


@CHECKS
@given(pages())
def test_metrics_agree_with_reference_parser(page: str) -> None:
    previous = Metrics(5, 6, 0.5, frozenset({"p"}), frozenset({"q"}), 7, 1.0)
    ours, _ = parse(page, MetricNames(), previous, 2.0)
    assert ours == reference_metrics(page, previous, 2.0)
