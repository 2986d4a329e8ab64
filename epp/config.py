"""Settings as frozen dataclasses with named defaults, checked when they are built.

Only the entry point (`epp.server.flags`) reads argv and the environment; everything else receives
these values through constructors, so tests build them directly. A value that cannot work (NaN or a
negative threshold, metrics refreshed less often than they go stale) raises `ConfigError` at
construction, whoever builds the settings: the EPP refuses to start rather than route on nonsense.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from epp.api.types import DEFAULT_POOL_GROUP, POOL_GROUPS
from epp.h2.limits import Limits

DEFAULT_GRPC_PORT = 9002
DEFAULT_GRPC_HEALTH_PORT = 9003
DEFAULT_METRICS_PORT = 9090
# The datastore debug view (ours, not upstream): its own listener, on loopback unless asked otherwise
# (it dumps every pod address and model, unauthenticated; DESIGN.md §6).
DEFAULT_DEBUG_PORT = 9091
DEFAULT_DEBUG_BIND_ADDRESS = "127.0.0.1"
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

# The largest request body the EPP accepts (413 above it), `--maxRequestBodyBytes`. Long prompts and
# base64 images are MBs; Envoy must buffer as much (its per-connection buffer limit, harness/envoy.py),
# and grpcio's receive limit (4 MiB by default) is raised to the body plus `GRPC_MESSAGE_HEADROOM`,
# so a body the EPP accepts is never refused by gRPC first.
DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024
# Room in one gRPC message for what travels with the body (framing, a header mutation, metadata).
GRPC_MESSAGE_HEADROOM = 1024 * 1024

# Draining on SIGTERM (`Epp.drain`): gRPC health says NOT_SERVING at once, ext_proc keeps serving for
# `--shutdownDelay` so load balancers (Envoy's health checks, the kubelet's readiness probe every 2 s
# in our chart, then the EndpointSlice) stop sending new streams; then new streams are refused
# (GOAWAY) and those in flight get `--shutdownGracePeriod` to finish. An ext_proc stream lasts as
# long as its response, so the grace period should cover the longest response; delay + grace must
# fit in the pod's terminationGracePeriodSeconds (130 s in deploy/chart).
DEFAULT_SHUTDOWN_DELAY = 5.0
DEFAULT_SHUTDOWN_GRACE_PERIOD = 120.0


class ConfigError(ValueError):
    """A setting that cannot work; `setting` is the field name (the entry point names its flag)."""

    def __init__(self, setting: str, value: object, rule: str) -> None:
        super().__init__(f"{setting}={value!r}: {rule}")
        self.setting = setting
        self.value = value
        self.rule = rule


def _fraction(setting: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ConfigError(setting, value, "must be a number from 0 to 1")


def _non_negative_count(setting: str, value: int) -> None:
    if value < 0:
        raise ConfigError(setting, value, "must be 0 or more")


def _non_negative(setting: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(setting, value, "must be 0 or a positive, finite number")


def _positive(setting: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(setting, value, "must be a positive, finite number")


# How the ext_proc port speaks gRPC: our HTTP/2 server on asyncio (`epp.h2`, the default: a third of
# grpc.aio's CPU per request behind Envoy) or grpcio's grpc.aio (kept as a fallback).
H2_TRANSPORT = "h2"
GRPCIO_TRANSPORT = "grpcio"
EXT_PROC_TRANSPORTS = (H2_TRANSPORT, GRPCIO_TRANSPORT)
DEFAULT_EXT_PROC_TRANSPORT = H2_TRANSPORT

# The asyncio event loop (epp.server.event_loop): uvloop when installed, uvloop, or asyncio's own.
AUTO_EVENT_LOOP = "auto"
UVLOOP_EVENT_LOOP = "uvloop"
ASYNCIO_EVENT_LOOP = "asyncio"
EVENT_LOOPS = (AUTO_EVENT_LOOP, UVLOOP_EVENT_LOOP, ASYNCIO_EVENT_LOOP)

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

    def __post_init__(self) -> None:
        _fraction("kv_cache_threshold", self.kv_cache_threshold)
        _non_negative_count("queue_threshold_critical", self.queue_threshold_critical)
        _non_negative_count("queueing_threshold_lora", self.queueing_threshold_lora)
        _fraction("lora_affinity_threshold", self.lora_affinity_threshold)
        _positive("metrics_staleness_threshold", self.metrics_staleness_threshold)


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

    def __post_init__(self) -> None:
        _positive("refresh_interval", self.refresh_interval)
        _positive("scrape_timeout", self.scrape_timeout)


# The watch liveness rule (DESIGN.md §6; epp/k8s/informer.py): every watch is asked to end after
# one interval (timeoutSeconds, spread up to +25%), so the API server's end of the watch, or the
# bookmark it sends 2 s before, or any event, shows the watch alive at least that often; a watch
# that reads nothing for two intervals is dead (a half-open connection) and is replaced, resuming
# from its last resourceVersion. kube-apiserver sends bookmarks about once a minute, hence 60 s.
DEFAULT_WATCH_BOOKMARK_INTERVAL = 60.0
# timeoutSeconds is whole seconds, at least 1.
MIN_WATCH_BOOKMARK_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class WatchConfig:
    bookmark_interval: float = DEFAULT_WATCH_BOOKMARK_INTERVAL

    def __post_init__(self) -> None:
        _positive("watch_bookmark_interval", self.bookmark_interval)
        if self.bookmark_interval < MIN_WATCH_BOOKMARK_INTERVAL:
            raise ConfigError(
                "watch_bookmark_interval",
                self.bookmark_interval,
                f"must be at least {MIN_WATCH_BOOKMARK_INTERVAL}s (timeoutSeconds is whole seconds)",
            )


# `--ha-enable-leader-election` (epp.k8s.leader): client-go's defaults.
DEFAULT_LEASE_DURATION = 15.0
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0


@dataclass(frozen=True, slots=True)
class LeaderElectionConfig:
    """Off by default (active-active replicas, DESIGN.md §4); on, only the Lease holder is SERVING."""

    enabled: bool = False
    identity: str = ""  # "" = the host name and a random suffix, chosen at start
    lease_duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD

    def __post_init__(self) -> None:
        _positive("leader_election_retry_period", self.retry_period)
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ConfigError(
                "leader_election_renew_deadline",
                self.renew_deadline,
                "needs retry period < renew deadline < lease duration",
            )


@dataclass(frozen=True, slots=True)
class ServerConfig:
    pool_name: str
    pool_namespace: str = DEFAULT_POOL_NAMESPACE
    # Which API generation is served (DESIGN.md §1): `inference.networking.k8s.io` (InferencePool v1,
    # InferenceObjective, InferenceModelRewrite) or `inference.networking.x-k8s.io` (v1alpha2:
    # InferencePool, InferenceModel). Upstream's `--pool-group`.
    pool_group: str = DEFAULT_POOL_GROUP
    grpc_port: int = DEFAULT_GRPC_PORT
    grpc_health_port: int = DEFAULT_GRPC_HEALTH_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    bind_address: str = "0.0.0.0"
    # /metrics alone on another address (e.g. 127.0.0.1 behind an authenticating proxy); "" = bind_address.
    metrics_bind_address: str = ""
    debug_port: int = DEFAULT_DEBUG_PORT
    debug_bind_address: str = DEFAULT_DEBUG_BIND_ADDRESS
    secure_serving: bool = True
    cert_path: str = ""
    destination_endpoint_hint_key: str = DEFAULT_DESTINATION_ENDPOINT_HINT_KEY
    destination_endpoint_hint_metadata_namespace: str = DEFAULT_DESTINATION_ENDPOINT_HINT_METADATA_NAMESPACE
    refresh_prometheus_metrics_interval: float = DEFAULT_REFRESH_PROMETHEUS_METRICS_INTERVAL
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    ext_proc_transport: str = DEFAULT_EXT_PROC_TRANSPORT
    event_loop: str = AUTO_EVENT_LOOP
    kubeconfig: str = ""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    prober: ProberConfig = field(default_factory=ProberConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    shutdown_delay: float = DEFAULT_SHUTDOWN_DELAY
    shutdown_grace_period: float = DEFAULT_SHUTDOWN_GRACE_PERIOD
    leader_election: LeaderElectionConfig = field(default_factory=LeaderElectionConfig)
    # The ext_proc port's HTTP/2 limits (`--h2-*`); its message limit comes from max_request_body_bytes.
    h2: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        _positive("refresh_prometheus_metrics_interval", self.refresh_prometheus_metrics_interval)
        _non_negative("shutdown_delay", self.shutdown_delay)
        _non_negative("shutdown_grace_period", self.shutdown_grace_period)
        if self.pool_group not in POOL_GROUPS:
            raise ConfigError("pool_group", self.pool_group, f"must be one of {', '.join(POOL_GROUPS)}")
        if self.max_request_body_bytes < 1:
            raise ConfigError("max_request_body_bytes", self.max_request_body_bytes, "must be 1 or more")
        if self.ext_proc_transport not in EXT_PROC_TRANSPORTS:
            raise ConfigError(
                "ext_proc_transport",
                self.ext_proc_transport,
                f"must be one of {', '.join(EXT_PROC_TRANSPORTS)}",
            )
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigError("event_loop", self.event_loop, f"must be one of {', '.join(EVENT_LOOPS)}")
        refresh, stale = self.prober.refresh_interval, self.scheduler.metrics_staleness_threshold
        if refresh > stale:
            # Every pod would look stale between two scrapes, and be treated as such.
            raise ConfigError(
                "refresh_interval",
                refresh,
                f"must not be longer than the metrics staleness threshold ({stale}s): pods would "
                "always look stale",
            )

    @property
    def grpc_max_message_bytes(self) -> int:
        """gRPC's send/receive limit on the ext_proc port, derived so it can never undercut the body limit."""
        return self.max_request_body_bytes + GRPC_MESSAGE_HEADROOM
