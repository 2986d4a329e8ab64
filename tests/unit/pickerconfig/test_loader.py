"""EndpointPickerConfig → settings: what each plugin type maps onto, and one test per error message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.config import (
    FILTER_TREE,
    MAX_SCORE_PICKER,
    RANDOM_PICKER,
    SCORER,
    WEIGHTED_RANDOM_PICKER,
    ConformanceHooks,
    MetricNames,
    ProberConfig,
    SchedulerConfig,
    StepModel,
    WeightedScorer,
)
from epp.pickerconfig import PickerConfig, PickerConfigError, load_picker_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "config"
HEAD = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig"}


def load(document: dict[str, Any] | str, **base: Any) -> PickerConfig:
    text = document if isinstance(document, str) else yaml.safe_dump({**HEAD, **document})
    return load_picker_config(
        text, scheduler=base.get("scheduler", SchedulerConfig()), prober=base.get("prober", ProberConfig())
    )


def profile(*refs: dict[str, Any], name: str = "default") -> list[dict[str, Any]]:
    return [{"name": name, "plugins": list(refs)}]


def test_upstream_default_profile_example() -> None:
    loaded = load((EXAMPLES / "upstream-default.yaml").read_text())
    s = loaded.scheduler
    assert s.kind == SCORER
    assert loaded.scheduling
    assert s.scoring_profile.scorers == (
        WeightedScorer("queue", 2.0),
        WeightedScorer("kv_cache", 2.0),
        WeightedScorer("prefix", 3.0),
    )
    assert s.scoring_profile.picker == MAX_SCORE_PICKER
    assert (s.prefix_block_chars, s.prefix_max_blocks, s.prefix_capacity_per_pod) == (64, 256, 31250)
    assert loaded.notes == ()


def test_our_default_written_as_a_config_file_is_our_default() -> None:
    """examples/config/epp-default.yaml stays what the EPP runs without a config file."""
    loaded = load((EXAMPLES / "epp-default.yaml").read_text()).scheduler
    default = SchedulerConfig()
    weighted = [s for s in default.scoring_profile.scorers if s.weight > 0]
    assert list(loaded.scoring_profile.scorers) == weighted
    assert loaded.scoring_profile.picker == default.scoring_profile.picker
    prefix = ("prefix_block_chars", "prefix_max_blocks", "prefix_capacity_per_pod")
    assert [getattr(loaded, k) for k in prefix] == [getattr(default, k) for k in prefix]
    step, expected = loaded.step_model, default.step_model
    fields = ("base_s", "prefill_token_s", "decode_sequence_s", "context_token_s")
    assert [getattr(step, f) for f in fields] == pytest.approx([getattr(expected, f) for f in fields])


def test_every_upstream_scorer_and_ours_map_onto_our_scorers() -> None:
    types = {
        "queue-scorer": "queue",
        "kv-cache-utilization-scorer": "kv_cache",
        "prefix-cache-scorer": "prefix",
        "lora-affinity-scorer": "lora",
        "running-requests-size-scorer": "running_requests",
        "in-flight-scorer": "in_flight",
    }
    plugins = [{"type": t} for t in types]
    refs = [{"pluginRef": t, "weight": i + 1} for i, t in enumerate(types)]
    s = load({"plugins": plugins, "schedulingProfiles": profile(*refs)}).scheduler
    assert s.scoring_profile.scorers == tuple(
        WeightedScorer(k, i + 1.0) for i, k in enumerate(types.values())
    )


@pytest.mark.parametrize(
    ("picker", "ours"),
    [
        pytest.param("max-score-picker", MAX_SCORE_PICKER, id="max-score"),
        pytest.param("random-picker", RANDOM_PICKER, id="random"),
        pytest.param("weighted-random-picker", WEIGHTED_RANDOM_PICKER, id="weighted-random"),
    ],
)
def test_pickers(picker: str, ours: str) -> None:
    doc = {"plugins": [{"type": "queue-scorer"}, {"type": picker}]}
    refs = ({"pluginRef": "queue-scorer"}, {"pluginRef": picker})
    assert load({**doc, "schedulingProfiles": profile(*refs)}).scheduler.scoring_profile.picker == ours


def test_unset_weight_is_one_and_no_picker_means_max_score() -> None:
    s = load(
        {"plugins": [{"type": "queue-scorer"}], "schedulingProfiles": profile({"pluginRef": "queue-scorer"})}
    )
    assert s.scheduler.scoring_profile.scorers == (WeightedScorer("queue", 1.0),)
    assert s.scheduler.scoring_profile.picker == MAX_SCORE_PICKER


def test_without_profiles_every_scheduling_plugin_forms_one() -> None:
    s = load({"plugins": [{"type": "queue-scorer"}, {"name": "r", "type": "random-picker"}]}).scheduler
    assert s.scoring_profile.scorers == (WeightedScorer("queue", 1.0),)
    assert s.scoring_profile.picker == RANDOM_PICKER


def test_without_scheduling_plugins_the_callers_scheduler_stays() -> None:
    base = SchedulerConfig(kind=FILTER_TREE)
    loaded = load({"plugins": [{"type": "metrics-data-source"}]}, scheduler=base)
    assert not loaded.scheduling
    assert loaded.scheduler == base


QUEUE = {"type": "queue-scorer"}
FILTER = {"type": "header-based-testing-filter"}
VERIFIER = {"type": "destination-endpoint-served-verifier"}


@pytest.mark.parametrize(
    ("doc", "hooks"),
    [
        pytest.param(
            {
                "plugins": [FILTER, VERIFIER, QUEUE],
                "schedulingProfiles": profile(
                    {"pluginRef": "header-based-testing-filter"}, {"pluginRef": "queue-scorer"}
                ),
            },
            ConformanceHooks(endpoint_selection_header=True, served_endpoint_header=True),
            id="both-in-a-profile",
        ),
        pytest.param(
            {"plugins": [FILTER, QUEUE]},
            ConformanceHooks(endpoint_selection_header=True),
            id="the-filter-in-the-implied-profile",
        ),
        pytest.param(
            {"plugins": [VERIFIER, QUEUE]}, ConformanceHooks(served_endpoint_header=True), id="the-verifier"
        ),
        pytest.param({"plugins": [QUEUE]}, ConformanceHooks(), id="neither"),
    ],
)
def test_upstreams_test_plugins_turn_on_the_conformance_hooks(
    doc: dict[str, Any], hooks: ConformanceHooks
) -> None:
    loaded = load(doc)
    assert loaded.conformance == hooks
    assert loaded.scheduler.scoring_profile.scorers == (WeightedScorer("queue", 1.0),), (
        "the filter is no scorer"
    )


def test_the_test_filter_alone_leaves_the_callers_scheduler() -> None:
    base = SchedulerConfig(kind=FILTER_TREE)
    loaded = load(
        {"plugins": [FILTER], "schedulingProfiles": profile({"pluginRef": FILTER["type"]})}, scheduler=base
    )
    assert loaded.scheduler == base
    assert loaded.conformance.endpoint_selection_header


def test_filter_tree_with_its_thresholds() -> None:
    params = {
        "kvCacheThreshold": 0.5,
        "queueThresholdCritical": 3,
        "queueingThresholdLora": 64,
        "loraAffinityThreshold": 0.9,
    }
    doc = {
        "plugins": [{"type": "filter-tree", "parameters": params}],
        "schedulingProfiles": profile({"pluginRef": "filter-tree"}),
    }
    s = load(doc).scheduler
    assert s.kind == FILTER_TREE
    assert (
        s.kv_cache_threshold,
        s.queue_threshold_critical,
        s.queueing_threshold_lora,
        s.lora_affinity_threshold,
    ) == (
        0.5,
        3,
        64,
        0.9,
    )


def test_utilization_detector_thresholds() -> None:
    params = {"queueDepthThreshold": 7, "kvCacheUtilThreshold": 0.9, "metricsStalenessThreshold": "200ms"}
    doc = {
        "plugins": [{"name": "sd", "type": "utilization-detector", "parameters": params}],
        "saturationDetector": {"pluginRef": "sd"},
    }
    s = load(doc).scheduler
    assert (s.queue_threshold_critical, s.kv_cache_threshold, s.metrics_staleness_threshold) == (7, 0.9, 0.2)


@pytest.mark.parametrize(
    ("params", "chars", "blocks", "capacity"),
    [
        pytest.param({"blockSizeTokens": 32}, 128, 256, 32768, id="tokens"),
        pytest.param({"blockSize": 100}, 100, 256, 32768, id="legacy-chars"),
        pytest.param({"maxPrefixBlocksToMatch": 16, "lruCapacityPerServer": 10}, 64, 16, 10, id="limits"),
        pytest.param(
            {"blockSizeTokens": 16, "maxPrefixTokensToMatch": 1024}, 64, 64, 32768, id="token-limit"
        ),
    ],
)
def test_prefix_parameters(params: dict[str, int], chars: int, blocks: int, capacity: int) -> None:
    doc = {"plugins": [{"type": "prefix-cache-scorer", "parameters": params}]}
    s = load(doc).scheduler
    assert (s.prefix_block_chars, s.prefix_max_blocks, s.prefix_capacity_per_pod) == (chars, blocks, capacity)
    assert s.prefix_aware


def test_predicted_ttft_step_model_parameters() -> None:
    """Durations, each replacing one cost of the default step model (Llama-3.1-8B on one H100)."""
    doc = {
        "plugins": [
            {
                "type": "predicted-ttft-scorer",
                "parameters": {"stepBase": "8ms", "prefillPerToken": "40us", "contextPerToken": "0.1us"},
            }
        ],
        "schedulingProfiles": [
            {"name": "default", "plugins": [{"pluginRef": "predicted-ttft-scorer", "weight": 5}]}
        ],
    }
    s = load(doc).scheduler
    step = s.step_model
    assert (step.base_s, step.prefill_token_s, step.context_token_s) == pytest.approx((8e-3, 40e-6, 1e-7))
    assert step.decode_sequence_s == StepModel().decode_sequence_s
    assert s.scoring_profile.weight_of("predicted_ttft") == 5
    assert load({"plugins": [{"type": "predicted-ttft-scorer"}]}).scheduler.step_model == StepModel()


def test_engine_configs_and_data_source() -> None:
    doc = {
        "plugins": [
            {
                "type": "metrics-data-source",
                "parameters": {"scheme": "https", "path": "/m", "insecureSkipVerify": False},
            },
            {
                "type": "core-metrics-extractor",
                "parameters": {
                    "engineLabelKey": "example.com/engine",
                    "defaultEngine": "mine",
                    "engineConfigs": [{"name": "mine", "queuedRequestsSpec": "q{a=b}", "kvUsageSpec": "kv"}],
                },
            },
        ],
        "dataLayer": {
            "sources": [
                {"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}
            ]
        },
    }
    p = load(doc).prober
    assert (p.scheme, p.path, p.insecure_skip_verify, p.engine_label_key) == (
        "https",
        "/m",
        False,
        "example.com/engine",
    )
    assert p.default_engine == "mine"
    mine = MetricNames(
        queued_requests="q{a=b}",
        running_requests="",
        kv_cache_usage="kv",
        kv_cache_usage_fallback="",
        lora_info="",
    )
    assert p.metric_names == mine == p.names_for("") == p.names_for("unknown")
    assert p.names_for("sglang").kv_cache_usage == "sglang:token_usage"  # built-ins kept
    assert p.names_for("vllm") == MetricNames()


def test_chart_sglang_default_engine() -> None:
    doc = {"plugins": [{"type": "core-metrics-extractor", "parameters": {"defaultEngine": "sglang"}}]}
    p = load(doc).prober
    assert p.names_for("").queued_requests == "sglang:num_queue_reqs"
    assert p.names_for("vllm").queued_requests == "vllm:num_requests_waiting"


@pytest.mark.parametrize(
    ("doc", "note"),
    [
        pytest.param(
            {"featureGates": ["flowControl"]},
            "feature gate flowControl: flow control is not implemented",
            id="gate",
        ),
        pytest.param(
            {"flowControl": {"maxRequests": 10}},
            "flowControl: flow control is not implemented",
            id="flow-control",
        ),
        pytest.param(
            {"plugins": [{"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 3}}]},
            "maxNumOfEndpoints > 1",
            id="several-endpoints",
        ),
        pytest.param(
            {"plugins": [{"type": "prefix-cache-scorer", "parameters": {"autoTune": True}}]},
            "autoTune",
            id="auto-tune",
        ),
        pytest.param(
            {"plugins": [{"type": "utilization-detector", "parameters": {"headroom": 0.2}}]},
            "headroom",
            id="headroom",
        ),
    ],
)
def test_accepted_but_inert_entries_come_back_as_notes(doc: dict[str, Any], note: str) -> None:
    notes = load(doc).notes
    assert any(note in n for n in notes), notes


# --- one case per error message: each names the entry --------------------------------------------
QS = {"type": "queue-scorer"}
ERRORS = [
    pytest.param("a: [", "not valid YAML at line 1", id="yaml"),
    pytest.param("- 1\n", "the config: must be a mapping, got list", id="not-a-mapping"),
    pytest.param({"kind": "Pool"}, "kind: must be EndpointPickerConfig, got 'Pool'", id="kind"),
    pytest.param(
        {"apiVersion": "v1"}, "apiVersion: must be inference.networking.x-k8s.io/v1alpha1", id="api-version"
    ),
    pytest.param({"plugin": []}, "the config: unknown field 'plugin'", id="unknown-top-level"),
    pytest.param(
        {"featureGates": ["warp"]}, "featureGates[0]: unknown feature gate 'warp'", id="unknown-gate"
    ),
    pytest.param(
        {"featureGates": "flowControl"},
        "featureGates: must be a list, got 'flowControl'",
        id="gates-not-list",
    ),
    pytest.param(
        {"plugins": [{"type": "magic-scorer"}]},
        "plugins[0] ('magic-scorer'): unknown plugin type 'magic-scorer'",
        id="unknown-type",
    ),
    pytest.param(
        {"plugins": [{"type": "latency-scorer"}]},
        "plugins[0] ('latency-scorer'): plugin type 'latency-scorer' is upstream's, not implemented by "
        "this EPP",
        id="not-implemented-type",
    ),
    pytest.param(
        {"plugins": [{"name": "x"}]}, "plugins[0].type: must be a non-empty string, got nothing", id="no-type"
    ),
    pytest.param(
        {"plugins": [{"type": "queue-scorer", "weight": 2}]},
        "plugins[0]: unknown field 'weight'",
        id="plugin-field",
    ),
    pytest.param(
        {"plugins": [QS, QS]},
        "plugins[1] ('queue-scorer'): plugin name 'queue-scorer' is already used by plugins[0]",
        id="dup-name",
    ),
    pytest.param(
        {"plugins": [{"type": "queue-scorer", "parameters": {"depth": 1}}]},
        "plugins[0] ('queue-scorer').parameters: unknown field 'depth' (known: none)",
        id="unknown-parameter",
    ),
    pytest.param(
        {"plugins": [{"type": "queue-scorer", "parameters": [1]}]},
        "plugins[0] ('queue-scorer').parameters: must be a mapping",
        id="params-not-mapping",
    ),
    pytest.param(
        {"plugins": [QS], "schedulingProfiles": profile({"pluginRef": "kv"})},
        "schedulingProfiles[0] ('default').plugins[0].pluginRef: 'kv' names no plugin in plugins",
        id="missing-plugin",
    ),
    pytest.param(
        {"plugins": [QS], "schedulingProfiles": profile({"pluginRef": "queue-scorer", "weight": -1})},
        "schedulingProfiles[0] ('default').plugins[0].weight: must be 0 or more, got -1",
        id="negative-weight",
    ),
    pytest.param(
        {"plugins": [QS], "schedulingProfiles": profile({"pluginRef": "queue-scorer", "weight": "heavy"})},
        "schedulingProfiles[0] ('default').plugins[0].weight: must be a finite number, got 'heavy'",
        id="weight-not-a-number",
    ),
    pytest.param(
        {
            "plugins": [QS],
            "schedulingProfiles": profile({"pluginRef": "queue-scorer", "weight": float("nan")}),
        },
        "schedulingProfiles[0] ('default').plugins[0].weight: must be a finite number",
        id="weight-nan",
    ),
    pytest.param(
        {"plugins": [QS], "schedulingProfiles": profile({"pluginRef": "queue-scorer", "weight": True})},
        "schedulingProfiles[0] ('default').plugins[0].weight: must be a finite number, got true",
        id="weight-bool",
    ),
    pytest.param(
        {
            "plugins": [{"type": "random-picker"}],
            "schedulingProfiles": profile({"pluginRef": "random-picker", "weight": 2}),
        },
        "schedulingProfiles[0] ('default').plugins[0]: only scorers take a weight, 'random-picker' is a "
        "picker",
        id="weight-on-picker",
    ),
    pytest.param(
        {
            "plugins": [QS],
            "schedulingProfiles": [*profile({"pluginRef": "queue-scorer"}), *profile(name="b")],
        },
        "schedulingProfiles: this EPP runs exactly one profile, got 2 ('default', 'b')",
        id="two-profiles",
    ),
    pytest.param(
        {"plugins": [QS], "schedulingProfiles": [{"plugins": []}]},
        "schedulingProfiles[0].name: must be a non-empty string",
        id="profile-no-name",
    ),
    pytest.param(
        {"plugins": [QS], "schedulingProfiles": profile()},
        "schedulingProfiles[0] ('default').plugins: a profile needs at least one",
        id="empty-profile",
    ),
    pytest.param(
        {"plugins": [QS], "schedulingProfiles": profile({"pluginRef": "queue-scorer", "wieght": 1})},
        "schedulingProfiles[0] ('default').plugins[0]: unknown field 'wieght'",
        id="ref-field",
    ),
    pytest.param(
        {
            "plugins": [QS],
            "schedulingProfiles": profile({"pluginRef": "queue-scorer"}, {"pluginRef": "queue-scorer"}),
        },
        "schedulingProfiles[0] ('default'): plugin 'queue-scorer' is listed twice",
        id="listed-twice",
    ),
    pytest.param(
        {
            "plugins": [{"type": "metrics-data-source"}],
            "schedulingProfiles": profile({"pluginRef": "metrics-data-source"}),
        },
        "schedulingProfiles[0] ('default').plugins[0]: plugin 'metrics-data-source' (metrics-data-source) "
        "is not a scorer",
        id="not-schedulable",
    ),
    pytest.param(
        {"plugins": [{"type": "random-picker"}, {"type": "max-score-picker"}]},
        "one picker per profile, got 2 (random-picker, max-score-picker)",
        id="two-pickers",
    ),
    pytest.param(
        {"plugins": [{"type": "filter-tree"}, QS]},
        "filter-tree decides alone; remove the other 1 plugin(s) from it",
        id="tree-with-scorer",
    ),
    pytest.param(
        {"plugins": [{"type": "filter-tree", "parameters": {"kvCacheThreshold": 2}}]},
        "plugins[0] ('filter-tree').parameters.kvCacheThreshold: must be a number from 0 to 1, got 2",
        id="tree-threshold",
    ),
    pytest.param(
        {"plugins": [{"type": "filter-tree", "parameters": {"queueThresholdCritical": -1}}]},
        "parameters.queueThresholdCritical: must be an integer of 0 or more, got -1",
        id="tree-queue",
    ),
    pytest.param(
        {"saturationDetector": {"pluginRef": "sd"}},
        "saturationDetector.pluginRef: 'sd' names no plugin in plugins",
        id="detector-missing",
    ),
    pytest.param(
        {"plugins": [QS], "saturationDetector": {"pluginRef": "queue-scorer"}},
        "saturationDetector.pluginRef: 'queue-scorer' (queue-scorer) is not a saturation detector",
        id="detector-wrong-type",
    ),
    pytest.param(
        {
            "plugins": [
                {"name": "a", "type": "utilization-detector"},
                {"name": "b", "type": "utilization-detector"},
            ]
        },
        "saturationDetector: several detectors defined (a, b)",
        id="two-detectors",
    ),
    pytest.param(
        {"plugins": [{"type": "utilization-detector", "parameters": {"queueDepthThreshold": 0}}]},
        "parameters.queueDepthThreshold: must be an integer of 1 or more, got 0",
        id="detector-queue",
    ),
    pytest.param(
        {"plugins": [{"type": "utilization-detector", "parameters": {"kvCacheUtilThreshold": 0}}]},
        "parameters.kvCacheUtilThreshold: must be in (0, 1], got 0",
        id="detector-kv",
    ),
    pytest.param(
        {"plugins": [{"type": "utilization-detector", "parameters": {"metricsStalenessThreshold": "soon"}}]},
        "parameters.metricsStalenessThreshold: must be a positive duration such as 200ms or 2s, got 'soon'",
        id="detector-staleness",
    ),
    pytest.param(
        {"plugins": [{"type": "utilization-detector", "parameters": {"headroom": -0.5}}]},
        "parameters.headroom: must be 0 or more, got -0.5",
        id="detector-headroom",
    ),
    pytest.param(
        {"plugins": [{"type": "prefix-cache-scorer", "parameters": {"blockSizeTokens": 0}}]},
        "plugins[0] ('prefix-cache-scorer').parameters.blockSizeTokens: must be an integer of 1 or more, "
        "got 0",
        id="prefix-block",
    ),
    pytest.param(
        {
            "plugins": [
                {"type": "prefix-cache-scorer", "parameters": {"blockSizeTokens": 16, "blockSize": 64}}
            ]
        },
        "give blockSizeTokens or the older blockSize (characters), not both",
        id="prefix-both-sizes",
    ),
    pytest.param(
        {"plugins": [{"type": "prefix-cache-scorer", "parameters": {"maxPrefixTokensToMatch": 1}}]},
        "parameters.maxPrefixTokensToMatch: 1 tokens is less than one block",
        id="prefix-token-limit",
    ),
    pytest.param(
        {
            "plugins": [
                {"type": "prefix-cache-scorer", "parameters": {"blockSizeTokens": 16}},
                {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 32}},
            ]
        },
        "plugins[1] ('approx-prefix-cache-producer').parameters: prefix_block_chars 128 disagrees with 64 "
        "set by plugins[0]",
        id="prefix-disagree",
    ),
    pytest.param(
        {"plugins": [{"type": "prefix-cache-scorer", "parameters": {"autoTune": "yes"}}]},
        "parameters.autoTune: must be true or false, got 'yes'",
        id="prefix-auto-tune",
    ),
    pytest.param(
        {"plugins": [{"type": "random-picker", "parameters": {"maxNumOfEndpoints": 0}}]},
        "parameters.maxNumOfEndpoints: must be an integer of 1 or more, got 0",
        id="picker-endpoints",
    ),
    pytest.param(
        {"plugins": [{"type": "metrics-data-source", "parameters": {"scheme": "ftp"}}]},
        "parameters.scheme: must be http or https, got 'ftp'",
        id="source-scheme",
    ),
    pytest.param(
        {"plugins": [{"type": "metrics-data-source", "parameters": {"path": "metrics"}}]},
        "parameters.path: must start with /, got 'metrics'",
        id="source-path",
    ),
    pytest.param(
        {"plugins": [{"type": "metrics-data-source", "parameters": {"insecureSkipVerify": "no"}}]},
        "parameters.insecureSkipVerify: must be true or false, got 'no'",
        id="source-verify",
    ),
    pytest.param(
        {"plugins": [{"type": "core-metrics-extractor", "parameters": {"defaultEngine": "tgi"}}]},
        "parameters.defaultEngine: 'tgi' has no engine config",
        id="extractor-default",
    ),
    pytest.param(
        {
            "plugins": [
                {"type": "core-metrics-extractor", "parameters": {"engineConfigs": [{"kvUsageSpec": "kv"}]}}
            ]
        },
        "parameters.engineConfigs[0].name: must be a non-empty string, got nothing",
        id="engine-no-name",
    ),
    pytest.param(
        {
            "plugins": [
                {
                    "type": "core-metrics-extractor",
                    "parameters": {"engineConfigs": [{"name": "e", "kvSpec": "kv"}]},
                }
            ]
        },
        "parameters.engineConfigs[0]: unknown field 'kvSpec'",
        id="engine-field",
    ),
    pytest.param(
        {
            "plugins": [
                {
                    "type": "core-metrics-extractor",
                    "parameters": {"engineConfigs": [{"name": "e", "kvUsageSpec": "kv{a}"}]},
                }
            ]
        },
        "parameters.engineConfigs[0] ('e').kvUsageSpec: invalid metric spec 'kv{a}'",
        id="engine-spec",
    ),
    pytest.param(
        {"plugins": [QS], "dataLayer": {"sources": [{"pluginRef": "queue-scorer"}]}},
        "dataLayer.sources[0].pluginRef: 'queue-scorer' (queue-scorer) is not a data source",
        id="data-source-type",
    ),
    pytest.param(
        {
            "plugins": [{"type": "metrics-data-source"}, QS],
            "dataLayer": {
                "sources": [
                    {"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "queue-scorer"}]}
                ]
            },
        },
        "dataLayer.sources[0].extractors[0].pluginRef: 'queue-scorer' (queue-scorer) is not an extractor",
        id="extractor-type",
    ),
    pytest.param(
        {"plugins": [QS], "parser": {"pluginRef": "queue-scorer"}},
        "parser.pluginRef: 'queue-scorer' (queue-scorer) is not a parser",
        id="parser-type",
    ),
    pytest.param(
        {"plugins": [{"type": "predicted-ttft-scorer", "parameters": {"prefillPerToken": 17}}]},
        "plugins[0] ('predicted-ttft-scorer').parameters.prefillPerToken: must be a positive duration",
        id="step-model-not-a-duration",
    ),
    pytest.param(
        {
            "plugins": [
                {"name": "a", "type": "predicted-ttft-scorer", "parameters": {"stepBase": "5ms"}},
                {"name": "b", "type": "predicted-ttft-scorer", "parameters": {"stepBase": "9ms"}},
            ]
        },
        "plugins[1] ('b').parameters: the step model differs from another predicted-ttft-scorer's",
        id="step-models-disagree",
    ),
]


@pytest.mark.parametrize(("doc", "message"), ERRORS)
def test_each_error_names_the_entry(doc: dict[str, Any] | str, message: str) -> None:
    with pytest.raises(PickerConfigError) as info:
        load(doc)
    text = str(info.value)
    assert message in text
    assert "\n" not in text
