"""Metric specs: which series of a model server's /metrics page feeds which field.

The metric-name flags take `name` or `name{label1=value1,label2=value2}` (epp-behaviour.md §4.4), so
an operator can point the EPP at one series of a family shared by several models. Specs are parsed
once at startup: a typo must stop the process with a readable message, not silently scrape nothing.
An empty (or blank) flag disables that metric (upstream #503).

Beyond upstream's grammar we validate names against the Prometheus name syntax (a spec whose name
can never appear on a page is a typo) and accept double-quoted values (`{a="b"}`), the form people
copy from a /metrics page.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A metric name plus the label pairs a series must carry to be used (extra labels are fine)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every listed pair is present with the same value."""
        return all(labels.get(key) == value for key, value in self.labels)

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        return self.name + "{" + ",".join(f"{k}={v}" for k, v in self.labels) + "}"


def parse_metric_spec(spec: str) -> MetricSpec | None:
    """Parse one flag value; None when it is empty (metric disabled). Raises ValueError on bad input."""
    text = spec.strip()
    if not text:
        return None
    start = text.find("{")
    end = text.find("}")
    if start == -1 and end == -1:
        return MetricSpec(_checked_name(text, spec))
    if start == -1 or end == -1 or end < start:
        raise ValueError(f"invalid metric spec {spec!r}: unbalanced braces")
    if text.count("{") > 1 or text.count("}") > 1:
        raise ValueError(f"invalid metric spec {spec!r}: more than one label block")
    if end != len(text) - 1:
        raise ValueError(f"invalid metric spec {spec!r}: unexpected text after '}}'")
    name = _checked_name(text[:start].strip(), spec)
    body = text[start + 1 : end]
    if not body.strip():
        raise ValueError(f"invalid metric spec {spec!r}: empty label block")
    pairs: dict[str, str] = {}
    for raw in body.split(","):
        key, value = _parse_pair(raw.strip(), spec)
        if key in pairs:
            raise ValueError(f"invalid metric spec {spec!r}: label {key!r} listed twice")
        pairs[key] = value
    return MetricSpec(name, tuple(pairs.items()))


def _checked_name(name: str, spec: str) -> str:
    if not name:
        raise ValueError(f"invalid metric spec {spec!r}: empty metric name")
    if not _METRIC_NAME.fullmatch(name):
        raise ValueError(f"invalid metric spec {spec!r}: {name!r} is not a valid metric name")
    return name


def _parse_pair(pair: str, spec: str) -> tuple[str, str]:
    parts = pair.split("=")
    if len(parts) != 2:
        raise ValueError(f"invalid metric spec {spec!r}: label pair {pair!r} is not key=value")
    key = parts[0].strip()
    value = parts[1].strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if not key or not value:
        raise ValueError(f"invalid metric spec {spec!r}: label pair {pair!r} has an empty key or value")
    if not _LABEL_NAME.fullmatch(key):
        raise ValueError(f"invalid metric spec {spec!r}: {key!r} is not a valid label name")
    return key, value
