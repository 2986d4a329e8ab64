"""Settings as frozen dataclasses with named defaults, checked when they are built.

Only the entry point (`epp.server.flags`) reads argv and the environment; everything else receives
these values through constructors, so tests build them directly. A value that cannot work (NaN or a
negative threshold, metrics refreshed less often than they go stale) raises `ConfigError` at
construction, whoever builds the settings: the EPP refuses to start rather than route on nonsense.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from epp.api.types import DEFAULT_POOL_GROUP as DEFAULT_POOL_GROUP
from epp.api.types import POOL_GROUPS as POOL_GROUPS
from epp.api.types import V1_GROUP, V1ALPHA2_GROUP
from epp.h2.limits import Limits

DEFAULT_GRPC_PORT = 9002
DEFAULT_GRPC_HEALTH_PORT = 9003
DEFAULT_METRICS_PORT = 9090
# The datastore debug view (ours, not upstream): its own listener, on loopback unless asked otherwise
# (it dumps every pod address and model, unauthenticated; DESIGN.md §6).
DEFAULT_DEBUG_PORT = 9091
DEFAULT_DEBUG_BIND_ADDRESS = "127.0.0.1"
DEFAULT_POOL_NAMESPACE = "default"
# `--pool-group`: which API generation the EPP serves (DESIGN.md §1). The v1 group is the default;
# the x-k8s.io group means v1alpha2 (InferencePool + InferenceModel as in upstream v0.3.0).
V1_POOL_GROUP = V1_GROUP
V1ALPHA2_POOL_GROUP = V1ALPHA2_GROUP
# Standalone mode (`--endpoint-selector`): at most this many `--endpoint-target-ports`, as a v1 pool.
MAX_TARGET_PORTS = 8
DEFAULT_REFRESH_METRICS_INTERVAL = 0.05
DEFAULT_REFRESH_PROMETHEUS_METRICS_INTERVAL = 5.0
DEFAULT_METRICS_STALENESS_THRESHOLD = 2.0
DEFAULT_SCRAPE_TIMEOUT = 5.0
DEFAULT_DESTINATION_ENDPOINT_HINT_KEY = "x-gateway-destination-endpoint"
DEFAULT_DESTINATION_ENDPOINT_HINT_METADATA_NAMESPACE = "envoy.lb"
# The v1 destination is a comma list: the pick, then this many fallbacks from the same ranking
# (`--destination-endpoint-fallbacks`, ours; upstream's picker parameter maxNumOfEndpoints is this
# plus one, default 1). 0 by default, as upstream: a proxy that reads one address only (an
# ORIGINAL_DST cluster, as upstream's test envoy.yaml and our harness have) 503s on a list. Behind a
# list-aware one (Envoy's override_host policy, which retries on the fallbacks) use
# RECOMMENDED_DESTINATION_FALLBACKS.
DEFAULT_DESTINATION_FALLBACKS = 0
RECOMMENDED_DESTINATION_FALLBACKS = 2

DEFAULT_QUEUED_REQUESTS_METRIC = "vllm:num_requests_waiting"
DEFAULT_RUNNING_REQUESTS_METRIC = "vllm:num_requests_running"
DEFAULT_KV_CACHE_USAGE_METRIC = "vllm:kv_cache_usage_perc"
FALLBACK_KV_CACHE_USAGE_METRIC = "vllm:gpu_cache_usage_perc"
DEFAULT_LORA_INFO_METRIC = "vllm:lora_requests_info"

# Model-server engines (upstream v1.5 `core-metrics-extractor`): a pod's engine is the value of its
# label `ENGINE_LABEL_KEY`; unlabelled pods (and unknown values) use the default engine's names.
ENGINE_LABEL_KEY = "inference.networking.k8s.io/engine-type"
VLLM_ENGINE = "vllm"
SGLANG_ENGINE = "sglang"
TRTLLM_SERVE_ENGINE = "trtllm-serve"
TRITON_TRTLLM_ENGINE = "triton-tensorrt-llm"
DEFAULT_ENGINE = VLLM_ENGINE
# How the prober reaches /metrics (`--model-server-metrics-*`, or `metrics-data-source` parameters).
DEFAULT_METRICS_SCHEME = "http"
METRICS_SCHEMES = ("http", "https")
DEFAULT_METRICS_PATH = "/metrics"

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
# Upstream's maxPrefixBlocksToMatch (4,096 tokens). 128 matched 2,048 tokens: in multi-turn chat
# every turn past that looked alike on every pod holding the conversation's start (virtual time,
# prefix-heavy at 0.9x, with the prefix recorded at the first byte: TTFT p90 62.4 -> 50.4 ms at 16
# engines, 96.2 -> 92.4 ms at 64).
DEFAULT_PREFIX_MAX_BLOCKS = 256
# Block hashes remembered per pod by the prefix index (the datastore's LRU).
DEFAULT_PREFIX_CAPACITY_PER_POD = 32768

# The scorers of the scorer scheduler (epp/scheduling/scorers.py), by our names; EndpointPickerConfig's
# plugin types map onto them (epp/pickerconfig).
QUEUE_SCORER = "queue"
KV_CACHE_SCORER = "kv_cache"
IN_FLIGHT_SCORER = "in_flight"
LORA_SCORER = "lora"
PREFIX_SCORER = "prefix"
RUNNING_REQUESTS_SCORER = "running_requests"
LAST_ROUTED_SCORER = "last_routed"
PREDICTED_TTFT_SCORER = "predicted_ttft"
# The measured opt-in weight of the last-routed scorer: 2 and more, with the in-flight count, outweigh
# LoRA affinity (adapters sent where every slot is held: TTFT p99 of seconds on the lora workload).
LAST_ROUTED_OPT_IN_WEIGHT = 1.0
# Characters per token of English text with Llama-style tokenizers (upstream's estimate too): turns
# body sizes and token block sizes into characters.
CHARS_PER_TOKEN = 4
# The predicted-TTFT scorer's default step model (StepModel): Llama-3.1-8B-Instruct on one H100.
DEFAULT_STEP_BASE_S = 5.7527e-3
DEFAULT_PREFILL_TOKEN_S = 17.25e-6
DEFAULT_DECODE_SEQUENCE_S = 6.0e-6
DEFAULT_CONTEXT_TOKEN_S = 3.9e-8
SCORER_KINDS = (
    QUEUE_SCORER,
    KV_CACHE_SCORER,
    IN_FLIGHT_SCORER,
    LORA_SCORER,
    PREFIX_SCORER,
    RUNNING_REQUESTS_SCORER,
    LAST_ROUTED_SCORER,
    PREDICTED_TTFT_SCORER,
)
# How the scorer scheduler picks from the totals: the highest (ties at random), uniformly at random
# (scores ignored), or at random in proportion to the totals.
MAX_SCORE_PICKER = "max-score"
RANDOM_PICKER = "random"
WEIGHTED_RANDOM_PICKER = "weighted-random"
PICKERS = (MAX_SCORE_PICKER, RANDOM_PICKER, WEIGHTED_RANDOM_PICKER)


@dataclass(frozen=True, slots=True)
class ScorerWeights:
    """Weights of the scorer scheduler's scorers (env QUEUE_SCORE_WEIGHT etc.); 0 turns one off."""

    queue: float = 1.0
    kv_cache: float = 1.0
    prefix: float = 2.0
    lora: float = 3.0
    in_flight: float = 2.0
    # Off by default, opt-in at LAST_ROUTED_OPT_IN_WEIGHT: measured in virtual time (README "Virtual
    # time") it cut TTFT p90 at 0.9x capacity on every workload against the profile of the time, but
    # it also outweighs scraped queue/KV differences of a few tenths, so at low load it rotates
    # requests over pods the scraped figures tell apart (the live routing tests pin those picks).
    # With the predicted-TTFT scorer on it adds little (within 3 ms at 64 engines).
    last_routed: float = 0.0
    # Measured in virtual time (README "Virtual time", 64 engines x 20,000 requests at 0.5-1.0x
    # capacity): TTFT p90 down on every workload against the profile without it; 2 keeps part of the
    # gain, 8 adds nothing on prefix-heavy. It abstains where the EPP sees no response body.
    predicted_ttft: float = 4.0


@dataclass(frozen=True, slots=True)
class StepModel:
    """The cost of one engine step, which the predicted-TTFT scorer predicts with: a fixed part, each
    prompt token prefilled, each sequence decoding one token, each token of context read.

    The defaults are Llama-3.1-8B-Instruct on one H100 with vLLM (the BLIS coefficients; the README's
    "calibrated engine" names the sources). Only ratios between pods matter to the scorer, so a model
    of the right shape ranks pods well on other hardware too; the parameters of the
    `predicted-ttft-scorer` plugin set them for another engine.
    """

    base_s: float = DEFAULT_STEP_BASE_S
    prefill_token_s: float = DEFAULT_PREFILL_TOKEN_S
    decode_sequence_s: float = DEFAULT_DECODE_SEQUENCE_S
    context_token_s: float = DEFAULT_CONTEXT_TOKEN_S

    def __post_init__(self) -> None:
        _positive("base_s", self.base_s)
        for name in ("prefill_token_s", "decode_sequence_s", "context_token_s"):
            _non_negative(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    kind: str
    weight: float

    def __post_init__(self) -> None:
        if self.kind not in SCORER_KINDS:
            raise ConfigError("scorer", self.kind, f"must be one of {', '.join(SCORER_KINDS)}")
        _non_negative("weight", self.weight)


@dataclass(frozen=True, slots=True)
class ScoringProfile:
    """What the scorer scheduler sums and how it picks (an EndpointPickerConfig profile, translated)."""

    scorers: tuple[WeightedScorer, ...]
    picker: str = MAX_SCORE_PICKER

    def __post_init__(self) -> None:
        if self.picker not in PICKERS:
            raise ConfigError("picker", self.picker, f"must be one of {', '.join(PICKERS)}")

    @classmethod
    def from_weights(cls, weights: ScorerWeights) -> ScoringProfile:
        """Our measured default: each of our scorers at its `ScorerWeights` weight, the highest total
        wins (prefix last: the compiled profile adds a trailing prefix scorer sparsely)."""
        return cls(
            tuple(
                WeightedScorer(kind, weight)
                for kind, weight in (
                    (QUEUE_SCORER, weights.queue),
                    (KV_CACHE_SCORER, weights.kv_cache),
                    (IN_FLIGHT_SCORER, weights.in_flight),
                    (LORA_SCORER, weights.lora),
                    (LAST_ROUTED_SCORER, weights.last_routed),
                    (PREDICTED_TTFT_SCORER, weights.predicted_ttft),
                    (PREFIX_SCORER, weights.prefix),
                )
            )
        )

    def weight_of(self, kind: str) -> float:
        return sum(s.weight for s in self.scorers if s.kind == kind)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Which scheduler, and its settings (env overrides KV_CACHE_THRESHOLD etc. are read by the entry
    point). The filter tree's thresholds also drive the scorer scheduler's shedding of non-critical
    requests. `profile` (from an EndpointPickerConfig) replaces the scorers `weights` describe."""

    kv_cache_threshold: float = DEFAULT_KV_CACHE_THRESHOLD
    queue_threshold_critical: int = DEFAULT_QUEUE_THRESHOLD_CRITICAL
    queueing_threshold_lora: int = DEFAULT_QUEUEING_THRESHOLD_LORA
    lora_affinity_threshold: float = DEFAULT_LORA_AFFINITY_THRESHOLD
    metrics_staleness_threshold: float = DEFAULT_METRICS_STALENESS_THRESHOLD
    kind: str = DEFAULT_SCHEDULER
    weights: ScorerWeights = field(default_factory=ScorerWeights)
    profile: ScoringProfile | None = None
    prefix_block_chars: int = DEFAULT_PREFIX_BLOCK_CHARS
    prefix_max_blocks: int = DEFAULT_PREFIX_MAX_BLOCKS
    prefix_capacity_per_pod: int = DEFAULT_PREFIX_CAPACITY_PER_POD
    step_model: StepModel = field(default_factory=StepModel)

    @property
    def scoring_profile(self) -> ScoringProfile:
        """The scorers and picker of the scorer scheduler."""
        return self.profile if self.profile is not None else ScoringProfile.from_weights(self.weights)

    @property
    def prefix_aware(self) -> bool:
        """Whether requests need prompt prefix hashes (only the scorer with a prefix weight uses them)."""
        return self.kind == SCORER and self.scoring_profile.weight_of(PREFIX_SCORER) > 0

    def __post_init__(self) -> None:
        _fraction("kv_cache_threshold", self.kv_cache_threshold)
        _non_negative_count("queue_threshold_critical", self.queue_threshold_critical)
        _non_negative_count("queueing_threshold_lora", self.queueing_threshold_lora)
        _fraction("lora_affinity_threshold", self.lora_affinity_threshold)
        _positive("metrics_staleness_threshold", self.metrics_staleness_threshold)
        if self.kind not in SCHEDULERS:
            raise ConfigError("kind", self.kind, f"must be one of {', '.join(SCHEDULERS)}")
        for name in ("prefix_block_chars", "prefix_max_blocks", "prefix_capacity_per_pod"):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "must be 1 or more")


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Metric specs (`name` or `name{k=v,...}`); an empty string disables that metric."""

    queued_requests: str = DEFAULT_QUEUED_REQUESTS_METRIC
    running_requests: str = DEFAULT_RUNNING_REQUESTS_METRIC
    kv_cache_usage: str = DEFAULT_KV_CACHE_USAGE_METRIC
    kv_cache_usage_fallback: str = FALLBACK_KV_CACHE_USAGE_METRIC
    lora_info: str = DEFAULT_LORA_INFO_METRIC


# Each engine's metric names, as upstream v1.5 knows them (reference/upstream-v1.md §d). An empty
# name disables that metric: only vLLM reports LoRA adapters.
ENGINE_METRIC_NAMES: tuple[tuple[str, MetricNames], ...] = (
    (VLLM_ENGINE, MetricNames()),
    (
        SGLANG_ENGINE,
        MetricNames(
            queued_requests="sglang:num_queue_reqs",
            running_requests="sglang:num_running_reqs",
            kv_cache_usage="sglang:token_usage",
            kv_cache_usage_fallback="",
            lora_info="",
        ),
    ),
    (
        TRTLLM_SERVE_ENGINE,
        MetricNames(
            queued_requests="trtllm_num_requests_waiting",
            running_requests="trtllm_num_requests_running",
            kv_cache_usage="trtllm_kv_cache_utilization",
            kv_cache_usage_fallback="",
            lora_info="",
        ),
    ),
    (
        TRITON_TRTLLM_ENGINE,
        MetricNames(
            queued_requests="nv_trt_llm_request_metrics{request_type=waiting}",
            running_requests="nv_trt_llm_request_metrics{request_type=scheduled}",
            kv_cache_usage="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
            kv_cache_usage_fallback="",
            lora_info="",
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class ProberConfig:
    """How pods are scraped. `metric_names` are the default engine's names (the v0.3 metric flags
    set them); `engines` holds every engine's names, the default engine's included or not. A pod's
    engine comes from its `engine_label_key` label; `names_for` picks its set."""

    refresh_interval: float = DEFAULT_REFRESH_METRICS_INTERVAL
    scrape_timeout: float = DEFAULT_SCRAPE_TIMEOUT
    metric_names: MetricNames = field(default_factory=MetricNames)
    engines: tuple[tuple[str, MetricNames], ...] = ENGINE_METRIC_NAMES
    default_engine: str = DEFAULT_ENGINE
    engine_label_key: str = ENGINE_LABEL_KEY
    scheme: str = DEFAULT_METRICS_SCHEME
    path: str = DEFAULT_METRICS_PATH
    # 0: scrape the pod's target port; otherwise this port (upstream's deprecated metrics-port flag).
    port: int = 0
    insecure_skip_verify: bool = True

    def __post_init__(self) -> None:
        _positive("refresh_interval", self.refresh_interval)
        _positive("scrape_timeout", self.scrape_timeout)
        if self.scheme not in METRICS_SCHEMES:
            raise ConfigError("metrics_scheme", self.scheme, "must be http or https")
        if not self.path.startswith("/"):
            raise ConfigError("metrics_path", self.path, "must start with /")
        if not 0 <= self.port <= 65535:
            raise ConfigError("metrics_port", self.port, "must be a port number (0: the target port)")
        if not self.default_engine:
            raise ConfigError("default_engine", self.default_engine, "must not be empty")

    def names_for(self, engine: str) -> MetricNames:
        """The metric names for a pod labelled `engine` ("" or an unknown engine: the default's)."""
        if engine and engine != self.default_engine:
            for name, names in self.engines:
                if name == engine:
                    return names
        return self.metric_names

    def engine_names(self) -> dict[str, MetricNames]:
        """Every engine's names, the default engine's being `metric_names`."""
        out = dict(self.engines)
        out[self.default_engine] = self.metric_names
        return out


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
class ConformanceHooks:
    """Upstream's two test plugins, for gateway conformance runs (its GatewayFollowingEPPRouting and
    GatewayDestinationEndpointServed tests): off unless an EndpointPickerConfig names them.

    `endpoint_selection_header` (`header-based-testing-filter`): the request header
    `test-epp-endpoint-selection` (a comma list of `ip` or `ip:port`) limits the candidates; a
    request without it has none (503). `served_endpoint_header` (`destination-endpoint-served-verifier`):
    the response carries `x-conformance-test-served-endpoint`, the endpoint the proxy reported as
    the one that served (or why there is none), so a test can read what the EPP was told.
    """

    endpoint_selection_header: bool = False
    served_endpoint_header: bool = False


NO_CONFORMANCE_HOOKS = ConformanceHooks()


@dataclass(frozen=True, slots=True)
class ServerConfig:
    # "" in standalone mode (`endpoint_selector` set instead).
    pool_name: str
    pool_namespace: str = DEFAULT_POOL_NAMESPACE
    # Which API generation is served (DESIGN.md §1): `inference.networking.k8s.io` (InferencePool v1,
    # InferenceObjective, InferenceModelRewrite) or `inference.networking.x-k8s.io` (v1alpha2:
    # InferencePool, InferenceModel). Upstream's `--pool-group`.
    pool_group: str = DEFAULT_POOL_GROUP
    # Standalone mode (`--endpoint-selector`): pods matching these labels, on these ports, no pool.
    endpoint_selector: tuple[tuple[str, str], ...] = ()
    endpoint_target_ports: tuple[int, ...] = ()
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
    # A setting only for now: read by nobody yet (`--enable-cert-reload`).
    enable_cert_reload: bool = False
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
    # The v1 request protocol (epp.handlers): fallbacks after the pick, and the proxy's subset hint.
    destination_fallbacks: int = DEFAULT_DESTINATION_FALLBACKS
    endpoint_subset_filter: bool = True
    # Upstream's test plugins (an EndpointPickerConfig naming them), for gateway conformance runs.
    conformance: ConformanceHooks = field(default_factory=ConformanceHooks)
    # The ext_proc port's HTTP/2 limits (`--h2-*`); its message limit comes from max_request_body_bytes.
    h2: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if self.pool_group not in POOL_GROUPS:
            raise ConfigError("pool_group", self.pool_group, f"must be one of {', '.join(POOL_GROUPS)}")
        if self.endpoint_selector:
            if self.pool_name:
                raise ConfigError("endpoint_selector", self.endpoint_selector, "excludes a pool name")
            if not 1 <= len(self.endpoint_target_ports) <= MAX_TARGET_PORTS:
                raise ConfigError(
                    "endpoint_target_ports",
                    self.endpoint_target_ports,
                    f"needs 1 to {MAX_TARGET_PORTS} ports with an endpoint selector",
                )
        for port in self.endpoint_target_ports:
            if not 1 <= port <= 65535:
                raise ConfigError("endpoint_target_ports", port, "must be a port number from 1 to 65535")
        _positive("refresh_prometheus_metrics_interval", self.refresh_prometheus_metrics_interval)
        _non_negative_count("destination_fallbacks", self.destination_fallbacks)
        _non_negative("shutdown_delay", self.shutdown_delay)
        _non_negative("shutdown_grace_period", self.shutdown_grace_period)
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
    def api_v1(self) -> bool:
        """True for the v1 API generation (the default), False for v1alpha2 (upstream v0.3.0's)."""
        return self.pool_group == V1_POOL_GROUP

    @property
    def standalone(self) -> bool:
        """Pods chosen by `endpoint_selector`, no InferencePool (upstream's standalone mode)."""
        return bool(self.endpoint_selector)

    @property
    def grpc_max_message_bytes(self) -> int:
        """gRPC's send/receive limit on the ext_proc port, derived so it can never undercut the body limit."""
        return self.max_request_body_bytes + GRPC_MESSAGE_HEADROOM
