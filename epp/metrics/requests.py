"""Per-request metrics: counters and histograms labelled by requested and target model.

Names, labels and buckets are upstream's (k8s component-base metrics, help text prefixed
`[ALPHA] `), so existing dashboards keep working. One difference is inherent to
`prometheus_client`: counters and histograms also expose a `<name>_created` series.
"""

from __future__ import annotations

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

_MODEL_LABELS = ("model_name", "target_model_name")
# The one `model_name` value of every request whose model the EPP does not know. Label values come
# only from InferenceModels (set by the cluster's operators), never from what a client typed: a
# client could otherwise create one series per made-up name (1,000 names made /metrics 2.25 MB).
# Not a valid OpenAI model id, so no real model shares it.
UNKNOWN_MODEL = "<unknown>"


class RequestMetrics:
    """The handler's only view of Prometheus; one instance per EPP, built on an injected registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests = Counter(
            "inference_model_request_total",
            "[ALPHA] Counter of inference model requests broken out for each model and target model.",
            _MODEL_LABELS,
            registry=registry,
        )
        self._errors = Counter(
            "inference_model_request_error_total",
            "[ALPHA] Counter of inference model requests errors broken out for each model and target model.",
            (*_MODEL_LABELS, "error_code"),
            registry=registry,
        )
        self._duration = Histogram(
            "inference_model_request_duration_seconds",
            "[ALPHA] Inference model response latency distribution in seconds for each model and "
            "target model.",
            _MODEL_LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._request_sizes = Histogram(
            "inference_model_request_sizes",
            "[ALPHA] Inference model requests size distribution in bytes for each model and target model.",
            _MODEL_LABELS,
            buckets=REQUEST_SIZE_BUCKETS,
            registry=registry,
        )
        self._response_sizes = Histogram(
            "inference_model_response_sizes",
            "[ALPHA] Inference model responses size distribution in bytes for each model and target model.",
            _MODEL_LABELS,
            buckets=RESPONSE_SIZE_BUCKETS,
            registry=registry,
        )
        self._input_tokens = Histogram(
            "inference_model_input_tokens",
            "[ALPHA] Inference model input token count distribution for requests in each model.",
            _MODEL_LABELS,
            buckets=INPUT_TOKEN_BUCKETS,
            registry=registry,
        )
        self._output_tokens = Histogram(
            "inference_model_output_tokens",
            "[ALPHA] Inference model output token count distribution for requests in each model.",
            _MODEL_LABELS,
            buckets=OUTPUT_TOKEN_BUCKETS,
            registry=registry,
        )
        self._running = Gauge(
            "inference_model_running_requests",
            "[ALPHA] Inference model number of running requests in each model.",
            ("model_name",),
            registry=registry,
        )

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
        )

    def request_routed(self, model: str, target: str, request_size: int) -> None:
        """A request body was handled and a destination chosen (upstream counts it here)."""
        self._requests.labels(model, target).inc()
        self._request_sizes.labels(model, target).observe(request_size)
        self._running.labels(model).inc()

    def request_finished(self, model: str) -> None:
        """The stream of a routed request ended, however it ended: pairs with `request_routed`."""
        self._running.labels(model).dec()

    def request_failed(self, model: str, target: str, error_code: str) -> None:
        self._errors.labels(model, target, error_code).inc()

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
        if duration > 0:
            self._duration.labels(model, target).observe(duration)
        self._response_sizes.labels(model, target).observe(response_size)
        if input_tokens > 0:
            self._input_tokens.labels(model, target).observe(input_tokens)
        if output_tokens > 0:
            self._output_tokens.labels(model, target).observe(output_tokens)
