"""The table from EndpointPickerConfig plugin types to what this EPP runs (DESIGN.md §7: a loader plus
a table, not a plugin framework).

Each entry names the type's role and the parameters it takes; the loader (`epp.pickerconfig.loader`)
checks every parameter against the entry and translates it into settings. Upstream's type names map
onto our scorers and pickers; ours (`in-flight-scorer`, `filter-tree`) have names of their own.
Upstream types this EPP does not implement are listed apart, so the error says "not implemented
here" rather than "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.config import (
    IN_FLIGHT_SCORER,
    KV_CACHE_SCORER,
    LAST_ROUTED_SCORER,
    LORA_SCORER,
    MAX_SCORE_PICKER,
    PREDICTED_TTFT_SCORER,
    PREFIX_SCORER,
    QUEUE_SCORER,
    RANDOM_PICKER,
    RUNNING_REQUESTS_SCORER,
    WEIGHTED_RANDOM_PICKER,
)

# Roles: what a plugin of that type is for, and where it may be referenced.
SCORER = "scorer"
PICKER = "picker"
FILTER_TREE = "filter-tree"  # decides alone: a profile with it has no scorer and no picker
# Upstream's test plugins (epp.config.ConformanceHooks): a filter a profile lists, and a response
# hook that takes effect by being declared.
TEST_FILTER = "test-filter"
TEST_RESPONSE_HOOK = "test-response-hook"
PROFILE_HANDLER = "profile-handler"
SATURATION_DETECTOR = "saturation-detector"
DATA_SOURCE = "data-source"
EXTRACTOR = "extractor"
PARSER = "parser"
PRODUCER = "producer"
# Roles a scheduling profile may reference.
PROFILE_ROLES = frozenset({SCORER, PICKER, FILTER_TREE, TEST_FILTER})

PREFIX_PARAMETERS = frozenset(
    {
        "blockSizeTokens",
        "blockSize",
        "maxPrefixBlocksToMatch",
        "maxPrefixTokensToMatch",
        "lruCapacityPerServer",
        "autoTune",
    }
)

# The predicted-TTFT scorer's step model (epp.config.StepModel), each a duration: parameter -> field.
STEP_MODEL_PARAMETERS = {
    "stepBase": "base_s",
    "prefillPerToken": "prefill_token_s",
    "decodePerSequence": "decode_sequence_s",
    "contextPerToken": "context_token_s",
}


@dataclass(frozen=True, slots=True)
class PluginType:
    role: str
    parameters: frozenset[str] = frozenset()
    # Our scorer (epp.config.SCORER_KINDS) or picker (epp.config.PICKERS) name, for those roles.
    ours: str = ""


PLUGIN_TYPES: dict[str, PluginType] = {
    # upstream's scorers
    "queue-scorer": PluginType(SCORER, ours=QUEUE_SCORER),
    "kv-cache-utilization-scorer": PluginType(SCORER, ours=KV_CACHE_SCORER),
    "prefix-cache-scorer": PluginType(SCORER, PREFIX_PARAMETERS, ours=PREFIX_SCORER),
    "lora-affinity-scorer": PluginType(SCORER, ours=LORA_SCORER),
    "running-requests-size-scorer": PluginType(SCORER, ours=RUNNING_REQUESTS_SCORER),
    # ours: the EPP's own count of requests in flight per pod (never stale)
    "in-flight-scorer": PluginType(SCORER, ours=IN_FLIGHT_SCORER),
    # ours: how many dispatches ago the EPP last routed to the pod (spaces each pod's arrivals)
    "last-routed-scorer": PluginType(SCORER, ours=LAST_ROUTED_SCORER),
    # ours: the first-token time an engine step model predicts from the EPP's own accounting
    "predicted-ttft-scorer": PluginType(SCORER, frozenset(STEP_MODEL_PARAMETERS), ours=PREDICTED_TTFT_SCORER),
    # upstream's pickers
    "max-score-picker": PluginType(PICKER, frozenset({"maxNumOfEndpoints"}), ours=MAX_SCORE_PICKER),
    "random-picker": PluginType(PICKER, frozenset({"maxNumOfEndpoints"}), ours=RANDOM_PICKER),
    "weighted-random-picker": PluginType(
        PICKER, frozenset({"maxNumOfEndpoints"}), ours=WEIGHTED_RANDOM_PICKER
    ),
    # ours: upstream v0.3.0's filter tree, with its four thresholds
    "filter-tree": PluginType(
        FILTER_TREE,
        frozenset(
            {"kvCacheThreshold", "queueThresholdCritical", "queueingThresholdLora", "loraAffinityThreshold"}
        ),
    ),
    "single-profile-handler": PluginType(PROFILE_HANDLER),
    "utilization-detector": PluginType(
        SATURATION_DETECTOR,
        frozenset({"queueDepthThreshold", "kvCacheUtilThreshold", "metricsStalenessThreshold", "headroom"}),
    ),
    "metrics-data-source": PluginType(DATA_SOURCE, frozenset({"scheme", "path", "insecureSkipVerify"})),
    "core-metrics-extractor": PluginType(
        EXTRACTOR, frozenset({"engineLabelKey", "defaultEngine", "engineConfigs"})
    ),
    "openai-parser": PluginType(PARSER),
    # upstream's test plugins, for gateway conformance runs (epp.config.ConformanceHooks)
    "header-based-testing-filter": PluginType(TEST_FILTER),
    "destination-endpoint-served-verifier": PluginType(TEST_RESPONSE_HOOK),
    # the prefix scorer's producer upstream (it holds the block parameters there)
    "approx-prefix-cache-producer": PluginType(PRODUCER, PREFIX_PARAMETERS),
}

# Upstream v1.5 types this EPP does not run: naming one is an error that says so.
NOT_IMPLEMENTED = frozenset(
    {
        "token-load-scorer",
        "latency-scorer",
        "predicted-latency-scorer",
        "predicted-latency-producer",
        "prefix-cache-affinity-filter",
        "slo-headroom-tier-filter",
        "fcfs-ordering-policy",
        "edf-ordering-policy",
        "slo-deadline-ordering-policy",
        "global-strict-fairness-policy",
        "round-robin-fairness-policy",
        "static-usage-limit-policy",
        "eviction-priority-then-time-ordering",
        "eviction-sheddable-filter",
        "concurrency-detector",
        "request-attribute-reporter",
        "inflight-load-producer",
        "latency-slo-admitter",
        "vllmgrpc-parser",
        "passthrough-parser",
    }
)

# Feature gates upstream v1.5 registers; none changes what this EPP does (the loader notes each).
FEATURE_GATES = {
    "dataLayer": "the prober is the only data layer here; the gate changes nothing",
    "enableLegacyMetrics": "the metric names follow --pool-group; the gate changes nothing",
    "flowControl": "flow control is not implemented: requests are never queued in the EPP, and "
    "sheddable ones get 429 when the pool is saturated",
}

# The engine config fields of `core-metrics-extractor` and the metric each feeds (None: accepted,
# not used here, e.g. the KV block geometry that upstream's prefix auto-tuning reads).
ENGINE_CONFIG_FIELDS: dict[str, str | None] = {
    "name": None,
    "queuedRequestsSpec": "queued_requests",
    "runningRequestsSpec": "running_requests",
    "kvUsageSpec": "kv_cache_usage",
    "loraSpec": "lora_info",
    "cacheInfoSpec": None,
    "cacheBlockSizeLabelName": None,
    "cacheNumBlocksLabelName": None,
    "cacheBlockSizeSpec": None,
    "cacheNumBlocksSpec": None,
}
