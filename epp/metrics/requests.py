"""Per-request metrics: counters and histograms labelled by requested and target model.

Names, labels and buckets are upstream's (k8s component-base metrics, help text prefixed
`[ALPHA] `), so existing dashboards keep working, in two generations chosen by the pool group
(reference/upstream-v1.md §e):
- v1alpha2 (upstream v0.3.0): `inference_model_*`.
- v1 (upstream v1.5.0): `inference_objective_*`, `request_total` with a `priority` label (the
  request's InferenceObjective priority), plus `inference_extension_scheduler_e2e_duration_seconds`
  (time spent in the scheduler per request) and `inference_extension_info{commit,build_ref}` (1).
One difference is inherent to `prometheus_client`: counters and histograms also expose a
`<name>_created` series.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.registry import Collector

_POW2_6_TO_30 = tuple(float(2**i) for i in range(6, 31))

# Upstream's bucket lists, including their quirks (32778, not 32768).
DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30,
    45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
REQUEST_SIZE_BUCKETS = _POW2_6_TO_30
RESPONSE_SIZE_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
INPUT_TOKEN_BUCKETS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
    524288, 1048576,
)  # fmt: skip
OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SCHEDULER_DURATION_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)

V1ALPHA2_SUBSYSTEM = "inference_model"
V1_SUBSYSTEM = "inference_objective"
SCHEDULER_E2E_DURATION = "inference_extension_scheduler_e2e_duration_seconds"
EXTENSION_INFO = "inference_extension_info"

_MODEL_LABELS = ("model_name", "target_model_name")
# The one `model_name` value of every request whose model the EPP does not know. Label values come
# only from InferenceModels (set by the cluster's operators), never from what a client typed: a
# client could otherwise create one series per made-up name (1,000 names made /metrics 2.25 MB).
# Not a valid OpenAI model id, so no real model shares it.
UNKNOWN_MODEL = "<unknown>"


class RequestMetrics:
    """The handler's only view of Prometheus; one instance per EPP, built on an injected registry.

    `api_v1` picks the generation of names (module docstring); `build` is (commit, build_ref) for
    `inference_extension_info` (v1 only)."""

    def __init__(
        self, registry: CollectorRegistry, *, api_v1: bool = False, build: tuple[str, str] = ("", "")
    ) -> None:
        self._v1 = api_v1
        sub = V1_SUBSYSTEM if api_v1 else V1ALPHA2_SUBSYSTEM
        what = "inference objective" if api_v1 else "inference model"
        subject = what[0].upper() + what[1:]
        self._requests = Counter(
            f"{sub}_request_total",
            f"[ALPHA] Counter of {what} requests broken out for each model and target model.",
            (*_MODEL_LABELS, "priority") if api_v1 else _MODEL_LABELS,
            registry=registry,
        )
        self._errors = Counter(
            f"{sub}_request_error_total",
            f"[ALPHA] Counter of {what} requests errors broken out for each model and target model.",
            (*_MODEL_LABELS, "error_code"),
            registry=registry,
        )
        self._duration = Histogram(
            f"{sub}_request_duration_seconds",
            f"[ALPHA] {subject} response latency distribution in seconds for each model and target model.",
            _MODEL_LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._request_sizes = Histogram(
            f"{sub}_request_sizes",
            f"[ALPHA] {subject} requests size distribution in bytes for each model and target model.",
            _MODEL_LABELS,
            buckets=REQUEST_SIZE_BUCKETS,
            registry=registry,
        )
        self._response_sizes = Histogram(
            f"{sub}_response_sizes",
            f"[ALPHA] {subject} responses size distribution in bytes for each model and target model.",
            _MODEL_LABELS,
            buckets=RESPONSE_SIZE_BUCKETS,
            registry=registry,
        )
        self._input_tokens = Histogram(
            f"{sub}_input_tokens",
            f"[ALPHA] {subject} input token count distribution for requests in each model.",
            _MODEL_LABELS,
            buckets=INPUT_TOKEN_BUCKETS,
            registry=registry,
        )
        self._output_tokens = Histogram(
            f"{sub}_output_tokens",
            f"[ALPHA] {subject} output token count distribution for requests in each model.",
            _MODEL_LABELS,
            buckets=OUTPUT_TOKEN_BUCKETS,
            registry=registry,
        )
        self._running = Gauge(
            f"{sub}_running_requests",
            f"[ALPHA] {subject} number of running requests in each model.",
            ("model_name",),
            registry=registry,
        )
        # The labelled children requests touch, by family and label values: `labels()` validates and
        # locks on every call (~1.3 µs, 8 calls per request). Made on first use, as `labels()` would
        # (a child exists as a series from then on); as bounded as the families' own children (label
        # values are known models, UNKNOWN_MODEL, error codes and objective priorities), and none is
        # ever removed from its family, so a cached child is the one `labels()` would return.
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}
        self._extra: tuple[Collector, ...] = ()
        self._scheduling: Histogram | None = None
        if api_v1:
            self._scheduling = Histogram(
                SCHEDULER_E2E_DURATION,
                "[ALPHA] Time the scheduler took to pick an endpoint for a request, in seconds.",
                buckets=SCHEDULER_DURATION_BUCKETS,
                registry=registry,
            )
            info = Gauge(
                EXTENSION_INFO,
                "[ALPHA] Build of this endpoint picker (always 1).",
                ("commit", "build_ref"),
                registry=registry,
            )
            info.labels(*build).set(1)
            self._extra = (self._scheduling, info)

    def collectors(self) -> tuple[Collector, ...]:
        """Everything registered by this instance (to unregister it when its EPP stops)."""
        return (
            self._requests,
            self._errors,
            self._duration,
            self._request_sizes,
            self._response_sizes,
            self._input_tokens,
            self._output_tokens,
            self._running,
            *self._extra,
        )

    def request_routed(self, model: str, target: str, request_size: int, *, priority: int = 0) -> None:
        """A request body was handled and a destination chosen (upstream counts it here).

        `priority` is the request's InferenceObjective priority (0 without one); only v1 names
        carry it."""
        child = self._child
        if self._v1:
            child(self._requests, model, target, str(priority)).inc()
        else:
            child(self._requests, model, target).inc()
        child(self._request_sizes, model, target).observe(request_size)
        child(self._running, model).inc()

    def request_finished(self, model: str) -> None:
        """The stream of a routed request ended, however it ended: pairs with `request_routed`."""
        self._child(self._running, model).dec()

    def _child(self, family: Counter | Gauge | Histogram, *labels: str) -> Any:
        key = (family, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = family.labels(*labels)
        return found

    def scheduled(self, seconds: float) -> None:
        """The scheduler spent `seconds` on one request (v1 only; v0.3 had no such metric)."""
        if self._scheduling is not None:
            self._scheduling.observe(seconds)

    def request_failed(self, model: str, target: str, error_code: str) -> None:
        self._child(self._errors, model, target, error_code).inc()

    def response_complete(
        self,
        model: str,
        target: str,
        *,
        duration: float,
        response_size: int,
        input_tokens: int,
        output_tokens: int,
    ) -> None:
        """The model server's response ended. Non-positive durations and token counts are skipped."""
        child = self._child
        if duration > 0:
            child(self._duration, model, target).observe(duration)
        child(self._response_sizes, model, target).observe(response_size)
        if input_tokens > 0:
            child(self._input_tokens, model, target).observe(input_tokens)
        if output_tokens > 0:
            child(self._output_tokens, model, target).observe(output_tokens)
