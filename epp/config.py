"""Settings as frozen dataclasses with named defaults.

Only the entry point (`epp.server.flags`) reads argv and the environment; everything else receives
these values through constructors, so tests build them directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_GRPC_PORT = 9002
DEFAULT_GRPC_HEALTH_PORT = 9003
DEFAULT_METRICS_PORT = 9090
DEFAULT_POOL_NAMESPACE = "default"
DEFAULT_REFRESH_METRICS_INTERVAL = 0.05
DEFAULT_REFRESH_PROMETHEUS_METRICS_INTERVAL = 5.0
DEFAULT_METRICS_STALENESS_THRESHOLD = 2.0
DEFAULT_SCRAPE_TIMEOUT = 5.0
DEFAULT_DESTINATION_ENDPOINT_HINT_KEY = "x-gateway-destination-endpoint"
DEFAULT_DESTINATION_ENDPOINT_HINT_METADATA_NAMESPACE = "envoy.lb"

DEFAULT_QUEUED_REQUESTS_METRIC = "vllm:num_requests_waiting"
DEFAULT_RUNNING_REQUESTS_METRIC = "vllm:num_requests_running"
DEFAULT_KV_CACHE_USAGE_METRIC = "vllm:kv_cache_usage_perc"
FALLBACK_KV_CACHE_USAGE_METRIC = "vllm:gpu_cache_usage_perc"
DEFAULT_LORA_INFO_METRIC = "vllm:lora_requests_info"

DEFAULT_KV_CACHE_THRESHOLD = 0.8
DEFAULT_QUEUE_THRESHOLD_CRITICAL = 5
DEFAULT_QUEUEING_THRESHOLD_LORA = 128
DEFAULT_LORA_AFFINITY_THRESHOLD = 0.999

# A 2 MiB prompt must pass BUFFERED through Envoy; grpcio's default receive limit is 4 MiB, and
# Envoy's buffer is raised to match (harness/envoy.py).
DEFAULT_GRPC_MAX_MESSAGE_BYTES = 32 * 1024 * 1024


FILTER_TREE = "filter-tree"
SCORER = "scorer"
SCHEDULERS = (FILTER_TREE, SCORER)
# The scorer scheduler won `harness bench routing` (README, "Routing quality"); the tree stays available.
DEFAULT_SCHEDULER = SCORER
DEFAULT_PREFIX_BLOCK_CHARS = 64
DEFAULT_PREFIX_MAX_BLOCKS = 128


@dataclass(frozen=True, slots=True)
class ScorerWeights:
    """Weights of the scorer scheduler's scorers (env QUEUE_SCORE_WEIGHT etc.); 0 turns one off."""

    queue: float = 1.0
    kv_cache: float = 1.0
    prefix: float = 2.0
    lora: float = 3.0
    in_flight: float = 2.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Which scheduler, and its settings (env overrides KV_CACHE_THRESHOLD etc. are read by the entry
    point). The filter tree's thresholds also drive the scorer scheduler's shedding of non-critical
    requests."""

    kv_cache_threshold: float = DEFAULT_KV_CACHE_THRESHOLD
    queue_threshold_critical: int = DEFAULT_QUEUE_THRESHOLD_CRITICAL
    queueing_threshold_lora: int = DEFAULT_QUEUEING_THRESHOLD_LORA
    lora_affinity_threshold: float = DEFAULT_LORA_AFFINITY_THRESHOLD
    metrics_staleness_threshold: float = DEFAULT_METRICS_STALENESS_THRESHOLD
    kind: str = DEFAULT_SCHEDULER
    weights: ScorerWeights = field(default_factory=ScorerWeights)
    prefix_block_chars: int = DEFAULT_PREFIX_BLOCK_CHARS
    prefix_max_blocks: int = DEFAULT_PREFIX_MAX_BLOCKS

    @property
    def prefix_aware(self) -> bool:
        """Whether requests need prompt prefix hashes (only the scorer with a prefix weight uses them)."""
        return self.kind == SCORER and self.weights.prefix > 0


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Metric specs (`name` or `name{k=v,...}`); an empty string disables that metric."""

    queued_requests: str = DEFAULT_QUEUED_REQUESTS_METRIC
    running_requests: str = DEFAULT_RUNNING_REQUESTS_METRIC
    kv_cache_usage: str = DEFAULT_KV_CACHE_USAGE_METRIC
    kv_cache_usage_fallback: str = FALLBACK_KV_CACHE_USAGE_METRIC
    lora_info: str = DEFAULT_LORA_INFO_METRIC


@dataclass(frozen=True, slots=True)
class ProberConfig:
    refresh_interval: float = DEFAULT_REFRESH_METRICS_INTERVAL
    scrape_timeout: float = DEFAULT_SCRAPE_TIMEOUT
    metric_names: MetricNames = field(default_factory=MetricNames)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    pool_name: str
    pool_namespace: str = DEFAULT_POOL_NAMESPACE
    grpc_port: int = DEFAULT_GRPC_PORT
    grpc_health_port: int = DEFAULT_GRPC_HEALTH_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    bind_address: str = "0.0.0.0"
    secure_serving: bool = True
    cert_path: str = ""
    destination_endpoint_hint_key: str = DEFAULT_DESTINATION_ENDPOINT_HINT_KEY
    destination_endpoint_hint_metadata_namespace: str = DEFAULT_DESTINATION_ENDPOINT_HINT_METADATA_NAMESPACE
    refresh_prometheus_metrics_interval: float = DEFAULT_REFRESH_PROMETHEUS_METRICS_INTERVAL
    grpc_max_message_bytes: int = DEFAULT_GRPC_MAX_MESSAGE_BYTES
    kubeconfig: str = ""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    prober: ProberConfig = field(default_factory=ProberConfig)
