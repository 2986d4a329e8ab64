"""EndpointPickerConfig text → settings, or one error naming the entry at fault (pure: no I/O).

The whole file is checked before anything is built: an unknown top-level field, plugin type,
parameter or feature gate, a bad weight, a profile naming a missing plugin, a second profile or a
second picker all raise `PickerConfigError`, so the EPP never serves half-configured. Rules beyond
upstream's (each stated in the message when it bites):

- One scheduling profile (this EPP has no profile handler other than `single-profile-handler`).
  With no `schedulingProfiles`, one profile holds every scorer and picker plugin (scorers at weight
  1); with no scheduling plugins either, the caller's scheduler stays (our measured default).
- A profile without a picker gets `max-score-picker`, as upstream. `filter-tree` decides alone.
- Prefix parameters may sit on `prefix-cache-scorer` or `approx-prefix-cache-producer` (upstream
  moved them to the producer); given on both, they must agree. `blockSizeTokens` is turned into
  characters at upstream's 4 characters per token.
- The `utilization-detector`'s thresholds are the thresholds our schedulers shed non-critical
  requests by (queue and KV), and its staleness threshold is the one fresh metrics are judged by.
- Things accepted that change nothing here come back as `notes`, for the entry point to log.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from epp.backend.metrics.spec import parse_metric_spec
from epp.config import (
    CHARS_PER_TOKEN,
    MAX_SCORE_PICKER,
    METRICS_SCHEMES,
    PREDICTED_TTFT_SCORER,
    ConfigError,
    ConformanceHooks,
    MetricNames,
    ProberConfig,
    SchedulerConfig,
    ScoringProfile,
    WeightedScorer,
)
from epp.config import (
    FILTER_TREE as FILTER_TREE_SCHEDULER,
)
from epp.config import (
    SCORER as SCORER_SCHEDULER,
)
from epp.pickerconfig.plugins import (
    DATA_SOURCE,
    ENGINE_CONFIG_FIELDS,
    EXTRACTOR,
    FEATURE_GATES,
    FILTER_TREE,
    NOT_IMPLEMENTED,
    PARSER,
    PICKER,
    PLUGIN_TYPES,
    PREFIX_PARAMETERS,
    PROFILE_ROLES,
    SATURATION_DETECTOR,
    SCORER,
    STEP_MODEL_PARAMETERS,
    TEST_FILTER,
    TEST_RESPONSE_HOOK,
    PluginType,
)

API_VERSION = "inference.networking.x-k8s.io/v1alpha1"
KIND = "EndpointPickerConfig"
TOP_LEVEL_FIELDS = frozenset(
    {
        "apiVersion",
        "kind",
        "featureGates",
        "plugins",
        "schedulingProfiles",
        "saturationDetector",
        "dataLayer",
        "flowControl",
        "parser",
    }
)
DEFAULT_SCORER_WEIGHT = 1.0


class PickerConfigError(ValueError):
    """The config cannot be used as written; the message names the entry and why."""


@dataclass(frozen=True, slots=True)
class PickerConfig:
    """What a config file sets. `scheduling` is False when it names no scheduling plugin at all."""

    scheduler: SchedulerConfig
    prober: ProberConfig
    scheduling: bool
    feature_gates: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    conformance: ConformanceHooks = dataclasses.field(default_factory=ConformanceHooks)


@dataclass(slots=True)
class _Plugin:
    where: str  # e.g. `plugins[2] ("my-queue")`, for messages
    name: str
    type_name: str
    kind: PluginType
    parameters: Mapping[str, Any]


def load_picker_config(text: str, *, scheduler: SchedulerConfig, prober: ProberConfig) -> PickerConfig:
    """Parse and check `text`; the settings it yields start from `scheduler` and `prober`."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise PickerConfigError(f"not valid YAML{where}: {problem}") from None
    return _Loader(scheduler, prober).load(document)


# --- small checks, each raising with the entry's name ------------------------------------------------
def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PickerConfigError(f"{where}: must be a mapping, got {_describe(value)}")
    for key in value:
        if not isinstance(key, str):
            raise PickerConfigError(f"{where}: field names must be strings, got {key!r}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PickerConfigError(f"{where}: must be a list, got {_describe(value)}")
    return value


def _string(value: object, where: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise PickerConfigError(
            f"{where}: must be a{'' if empty else ' non-empty'} string, got {_describe(value)}"
        )
    return value


def _only(fields: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise PickerConfigError(
            f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(allowed)) or 'none'})"
        )


def _positive_int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PickerConfigError(f"{where}: must be an integer of 1 or more, got {_describe(value)}")
    return value


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PickerConfigError(f"{where}: must be a finite number, got {_describe(value)}")
    return float(value)


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise PickerConfigError(f"{where}: must be true or false, got {_describe(value)}")
    return value


_DURATION = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(value: object, where: str) -> float:
    """A Kubernetes duration string (`200ms`, `1m30s`), in seconds; must be positive."""
    text = value.strip() if isinstance(value, str) else ""
    total, pos = 0.0, 0
    while text and pos < len(text):
        match = _DURATION.match(text, pos)
        if match is None:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text) or total <= 0:
        raise PickerConfigError(
            f"{where}: must be a positive duration such as 200ms or 2s, got {_describe(value)}"
        )
    return total


def _describe(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float | str):
        return repr(value)
    return type(value).__name__


class _Loader:
    def __init__(self, scheduler: SchedulerConfig, prober: ProberConfig) -> None:
        self._scheduler = scheduler
        self._prober = prober
        self._sched: dict[str, Any] = {}
        self._probe: dict[str, Any] = {}
        self._notes: list[str] = []
        # prefix setting -> (value, the entry that set it), to catch two entries disagreeing
        self._prefix: dict[str, tuple[int, str]] = {}
        self._hooks: dict[str, bool] = {}

    def load(self, document: object) -> PickerConfig:
        top = _mapping(document, "the config")
        _only(top, TOP_LEVEL_FIELDS, "the config")
        if top.get("kind") != KIND:
            raise PickerConfigError(f"kind: must be {KIND}, got {_describe(top.get('kind'))}")
        if top.get("apiVersion") != API_VERSION:
            raise PickerConfigError(
                f"apiVersion: must be {API_VERSION}, got {_describe(top.get('apiVersion'))}"
            )
        gates = self._feature_gates(top.get("featureGates"))
        plugins = self._plugins(top.get("plugins"))
        for plugin in plugins.values():
            self._parameters(plugin)
        scheduling = self._profiles(top.get("schedulingProfiles"), plugins)
        if any(p.kind.role == TEST_RESPONSE_HOOK for p in plugins.values()):
            self._hooks["served_endpoint_header"] = True
        self._saturation_detector(top.get("saturationDetector"), plugins)
        self._data_layer(top.get("dataLayer"), plugins)
        self._parser(top.get("parser"), plugins)
        if top.get("flowControl"):
            self._notes.append("flowControl: " + FEATURE_GATES["flowControl"])
        try:
            scheduler = dataclasses.replace(self._scheduler, **self._sched)
            prober = dataclasses.replace(self._prober, **self._probe)
        except ConfigError as exc:  # a combination no single entry shows (e.g. prefix token limits)
            raise PickerConfigError(f"{exc.setting}={exc.value!r}: {exc.rule}") from None
        hooks = ConformanceHooks(**self._hooks)
        return PickerConfig(scheduler, prober, scheduling, frozenset(gates), tuple(self._notes), hooks)

    # --- sections ------------------------------------------------------------------------------
    def _feature_gates(self, value: object) -> list[str]:
        gates = _list(value, "featureGates")
        for i, gate in enumerate(gates):
            name = _string(gate, f"featureGates[{i}]")
            if name not in FEATURE_GATES:
                raise PickerConfigError(
                    f"featureGates[{i}]: unknown feature gate {name!r} "
                    f"(known: {', '.join(sorted(FEATURE_GATES))})"
                )
            self._notes.append(f"feature gate {name}: {FEATURE_GATES[name]}")
        return gates

    def _plugins(self, value: object) -> dict[str, _Plugin]:
        plugins: dict[str, _Plugin] = {}
        for i, entry in enumerate(_list(value, "plugins")):
            fields = _mapping(entry, f"plugins[{i}]")
            _only(fields, frozenset({"name", "type", "parameters"}), f"plugins[{i}]")
            type_name = _string(fields.get("type"), f"plugins[{i}].type")
            name = fields.get("name") or type_name
            name = _string(name, f"plugins[{i}].name")
            where = f"plugins[{i}] ({name!r})"
            if type_name in NOT_IMPLEMENTED:
                raise PickerConfigError(
                    f"{where}: plugin type {type_name!r} is upstream's, not implemented by this EPP"
                )
            kind = PLUGIN_TYPES.get(type_name)
            if kind is None:
                raise PickerConfigError(
                    f"{where}: unknown plugin type {type_name!r} (known: {', '.join(sorted(PLUGIN_TYPES))})"
                )
            if name in plugins:
                raise PickerConfigError(
                    f"{where}: plugin name {name!r} is already used by {plugins[name].where}"
                )
            parameters = _mapping(fields.get("parameters"), f"{where}.parameters")
            _only(parameters, kind.parameters, f"{where}.parameters")
            plugins[name] = _Plugin(where, name, type_name, kind, parameters)
        return plugins

    def _profiles(self, value: object, plugins: Mapping[str, _Plugin]) -> bool:
        profiles = _list(value, "schedulingProfiles")
        if not profiles:
            implied = [(p, None) for p in plugins.values() if p.kind.role in PROFILE_ROLES]
            if not implied:
                return False
            self._build_profile("the implied profile (no schedulingProfiles)", implied)
            return True
        if len(profiles) > 1:
            names = ", ".join(repr(_mapping(p, "schedulingProfiles").get("name")) for p in profiles)
            raise PickerConfigError(
                f"schedulingProfiles: this EPP runs exactly one profile, got {len(profiles)} ({names})"
            )
        fields = _mapping(profiles[0], "schedulingProfiles[0]")
        _only(fields, frozenset({"name", "plugins"}), "schedulingProfiles[0]")
        name = _string(fields.get("name"), "schedulingProfiles[0].name")
        where = f"schedulingProfiles[0] ({name!r})"
        members: list[tuple[_Plugin, float | None]] = []
        for j, ref in enumerate(_list(fields.get("plugins"), f"{where}.plugins")):
            at = f"{where}.plugins[{j}]"
            ref_fields = _mapping(ref, at)
            _only(ref_fields, frozenset({"pluginRef", "weight"}), at)
            plugin = self._ref(ref_fields.get("pluginRef"), plugins, f"{at}.pluginRef")
            if plugin.kind.role not in PROFILE_ROLES:
                raise PickerConfigError(
                    f"{at}: plugin {plugin.name!r} ({plugin.type_name}) "
                    "is not a scorer, picker, filter or filter-tree"
                )
            weight = ref_fields.get("weight")
            if weight is not None:
                if plugin.kind.role != SCORER:
                    raise PickerConfigError(
                        f"{at}: only scorers take a weight, {plugin.name!r} is a {plugin.kind.role}"
                    )
                number = _number(weight, f"{at}.weight")
                if number < 0:
                    raise PickerConfigError(f"{at}.weight: must be 0 or more, got {_describe(weight)}")
                weight = number
            members.append((plugin, weight))
        if not members:
            raise PickerConfigError(
                f"{where}.plugins: a profile needs at least one scorer, picker or filter-tree"
            )
        self._build_profile(where, members)
        return True

    def _build_profile(self, where: str, members: Sequence[tuple[_Plugin, float | None]]) -> None:
        if any(p.kind.role == TEST_FILTER for p, _ in members):
            self._hooks["endpoint_selection_header"] = True
            members = [(p, w) for p, w in members if p.kind.role != TEST_FILTER]
            if not members:
                return  # the filter alone: the scheduler stays as the flags chose it
        roles = [p.kind.role for p, _ in members]
        if FILTER_TREE in roles:
            if len(members) > 1:
                raise PickerConfigError(
                    f"{where}: filter-tree decides alone; "
                    f"remove the other {len(members) - 1} plugin(s) from it"
                )
            self._sched["kind"] = FILTER_TREE_SCHEDULER
            return
        pickers = [p for p, _ in members if p.kind.role == PICKER]
        if len(pickers) > 1:
            raise PickerConfigError(
                f"{where}: one picker per profile, got {len(pickers)} ({', '.join(p.name for p in pickers)})"
            )
        seen: dict[str, str] = {}
        scorers: list[WeightedScorer] = []
        for plugin, weight in members:
            if plugin.kind.role != SCORER:
                continue
            if plugin.name in seen:
                raise PickerConfigError(f"{where}: plugin {plugin.name!r} is listed twice")
            seen[plugin.name] = plugin.type_name
            scorers.append(
                WeightedScorer(plugin.kind.ours, DEFAULT_SCORER_WEIGHT if weight is None else weight)
            )
        picker = pickers[0].kind.ours if pickers else MAX_SCORE_PICKER
        self._sched["kind"] = SCORER_SCHEDULER
        self._sched["profile"] = ScoringProfile(tuple(scorers), picker)

    def _ref(self, value: object, plugins: Mapping[str, _Plugin], where: str) -> _Plugin:
        name = _string(value, where)
        plugin = plugins.get(name)
        if plugin is None:
            raise PickerConfigError(f"{where}: {name!r} names no plugin in plugins")
        return plugin

    def _saturation_detector(self, value: object, plugins: Mapping[str, _Plugin]) -> None:
        detectors = [p for p in plugins.values() if p.kind.role == SATURATION_DETECTOR]
        if value is not None:
            fields = _mapping(value, "saturationDetector")
            _only(fields, frozenset({"pluginRef"}), "saturationDetector")
            plugin = self._ref(fields.get("pluginRef"), plugins, "saturationDetector.pluginRef")
            if plugin.kind.role != SATURATION_DETECTOR:
                raise PickerConfigError(
                    f"saturationDetector.pluginRef: {plugin.name!r} ({plugin.type_name}) "
                    "is not a saturation detector"
                )
            detectors = [plugin]
        if len(detectors) > 1:
            raise PickerConfigError(
                "saturationDetector: several detectors defined "
                f"({', '.join(p.name for p in detectors)}); "
                "name the one to use in saturationDetector.pluginRef"
            )
        if detectors:
            self._apply_detector(detectors[0])

    def _data_layer(self, value: object, plugins: Mapping[str, _Plugin]) -> None:
        if value is None:
            return
        fields = _mapping(value, "dataLayer")
        _only(fields, frozenset({"sources"}), "dataLayer")
        for i, source in enumerate(_list(fields.get("sources"), "dataLayer.sources")):
            at = f"dataLayer.sources[{i}]"
            source_fields = _mapping(source, at)
            _only(source_fields, frozenset({"pluginRef", "extractors"}), at)
            plugin = self._ref(source_fields.get("pluginRef"), plugins, f"{at}.pluginRef")
            if plugin.kind.role != DATA_SOURCE:
                raise PickerConfigError(
                    f"{at}.pluginRef: {plugin.name!r} ({plugin.type_name}) is not a data source"
                )
            for j, extractor in enumerate(_list(source_fields.get("extractors"), f"{at}.extractors")):
                ex_at = f"{at}.extractors[{j}]"
                ex_fields = _mapping(extractor, ex_at)
                _only(ex_fields, frozenset({"pluginRef"}), ex_at)
                found = self._ref(ex_fields.get("pluginRef"), plugins, f"{ex_at}.pluginRef")
                if found.kind.role != EXTRACTOR:
                    raise PickerConfigError(
                        f"{ex_at}.pluginRef: {found.name!r} ({found.type_name}) is not an extractor"
                    )

    def _parser(self, value: object, plugins: Mapping[str, _Plugin]) -> None:
        if value is None:
            return
        fields = _mapping(value, "parser")
        _only(fields, frozenset({"pluginRef"}), "parser")
        plugin = self._ref(fields.get("pluginRef"), plugins, "parser.pluginRef")
        if plugin.kind.role != PARSER:
            raise PickerConfigError(f"parser.pluginRef: {plugin.name!r} ({plugin.type_name}) is not a parser")

    # --- parameters, by role -----------------------------------------------------------------------
    def _parameters(self, plugin: _Plugin) -> None:
        params, at = plugin.parameters, f"{plugin.where}.parameters"
        if plugin.kind.parameters == PREFIX_PARAMETERS:
            self._prefix_parameters(params, at)
        elif plugin.kind.ours == PREDICTED_TTFT_SCORER:
            self._step_model_parameters(params, at)
        elif plugin.kind.role == PICKER and "maxNumOfEndpoints" in params:
            if _positive_int(params["maxNumOfEndpoints"], f"{at}.maxNumOfEndpoints") > 1:
                self._notes.append(
                    f"{plugin.where}: maxNumOfEndpoints > 1: one endpoint is picked per request"
                )
        elif plugin.kind.role == FILTER_TREE:
            self._filter_tree_parameters(params, at)
        elif plugin.kind.role == DATA_SOURCE:
            self._data_source_parameters(params, at)
        elif plugin.kind.role == EXTRACTOR:
            self._extractor_parameters(params, at)

    def _prefix_parameters(self, params: Mapping[str, Any], at: str) -> None:
        if "blockSizeTokens" in params and "blockSize" in params:
            raise PickerConfigError(
                f"{at}: give blockSizeTokens or the older blockSize (characters), not both"
            )
        block_chars = None
        if "blockSizeTokens" in params:
            block_chars = _positive_int(params["blockSizeTokens"], f"{at}.blockSizeTokens") * CHARS_PER_TOKEN
        elif "blockSize" in params:
            block_chars = _positive_int(params["blockSize"], f"{at}.blockSize")
        if block_chars is not None:
            self._set_prefix("prefix_block_chars", block_chars, at)
        if "maxPrefixBlocksToMatch" in params:
            blocks = _positive_int(params["maxPrefixBlocksToMatch"], f"{at}.maxPrefixBlocksToMatch")
            self._set_prefix("prefix_max_blocks", blocks, at)
        if "maxPrefixTokensToMatch" in params:
            # Takes precedence over maxPrefixBlocksToMatch, as upstream.
            tokens = _positive_int(params["maxPrefixTokensToMatch"], f"{at}.maxPrefixTokensToMatch")
            chars = (
                block_chars
                or self._prefix.get("prefix_block_chars", (self._scheduler.prefix_block_chars, ""))[0]
            )
            blocks = tokens * CHARS_PER_TOKEN // chars
            if blocks < 1:
                raise PickerConfigError(
                    f"{at}.maxPrefixTokensToMatch: {tokens} tokens is less than one block"
                )
            self._prefix.pop("prefix_max_blocks", None)
            self._set_prefix("prefix_max_blocks", blocks, at)
        if "lruCapacityPerServer" in params:
            capacity = _positive_int(params["lruCapacityPerServer"], f"{at}.lruCapacityPerServer")
            self._set_prefix("prefix_capacity_per_pod", capacity, at)
        if "autoTune" in params and _bool(params["autoTune"], f"{at}.autoTune"):
            self._notes.append(f"{at}.autoTune: not implemented; the block size stays as configured")

    def _step_model_parameters(self, params: Mapping[str, Any], at: str) -> None:
        given = {
            field: _duration(params[name], f"{at}.{name}")
            for name, field in STEP_MODEL_PARAMETERS.items()
            if name in params
        }
        step = dataclasses.replace(self._scheduler.step_model, **given)
        earlier = self._sched.setdefault("step_model", step)
        if earlier != step:
            raise PickerConfigError(f"{at}: the step model differs from another predicted-ttft-scorer's")

    def _set_prefix(self, setting: str, value: int, at: str) -> None:
        earlier = self._prefix.get(setting)
        if earlier is not None and earlier[0] != value:
            raise PickerConfigError(
                f"{at}: {setting} {value} disagrees with {earlier[0]} set by {earlier[1]}"
            )
        self._prefix[setting] = (value, at)
        self._sched[setting] = value

    def _filter_tree_parameters(self, params: Mapping[str, Any], at: str) -> None:
        if "kvCacheThreshold" in params:
            self._sched["kv_cache_threshold"] = self._fraction(
                params["kvCacheThreshold"], f"{at}.kvCacheThreshold"
            )
        if "loraAffinityThreshold" in params:
            value = self._fraction(params["loraAffinityThreshold"], f"{at}.loraAffinityThreshold")
            self._sched["lora_affinity_threshold"] = value
        for key, setting in (
            ("queueThresholdCritical", "queue_threshold_critical"),
            ("queueingThresholdLora", "queueing_threshold_lora"),
        ):
            if key in params:
                value = params[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise PickerConfigError(
                        f"{at}.{key}: must be an integer of 0 or more, got {_describe(value)}"
                    )
                self._sched[setting] = value

    def _apply_detector(self, plugin: _Plugin) -> None:
        params, at = plugin.parameters, f"{plugin.where}.parameters"
        if "queueDepthThreshold" in params:
            self._sched["queue_threshold_critical"] = _positive_int(
                params["queueDepthThreshold"], f"{at}.queueDepthThreshold"
            )
        if "kvCacheUtilThreshold" in params:
            value = _number(params["kvCacheUtilThreshold"], f"{at}.kvCacheUtilThreshold")
            if not 0 < value <= 1:
                raise PickerConfigError(f"{at}.kvCacheUtilThreshold: must be in (0, 1], got {value:g}")
            self._sched["kv_cache_threshold"] = value
        if "metricsStalenessThreshold" in params:
            self._sched["metrics_staleness_threshold"] = _duration(
                params["metricsStalenessThreshold"], f"{at}.metricsStalenessThreshold"
            )
        if "headroom" in params:
            headroom = _number(params["headroom"], f"{at}.headroom")
            if headroom < 0:
                raise PickerConfigError(f"{at}.headroom: must be 0 or more, got {headroom:g}")
            if headroom > 0:
                self._notes.append(f"{at}.headroom: not implemented; endpoints are not filtered by load")

    def _data_source_parameters(self, params: Mapping[str, Any], at: str) -> None:
        if "scheme" in params:
            scheme = _string(params["scheme"], f"{at}.scheme")
            if scheme not in METRICS_SCHEMES:
                raise PickerConfigError(f"{at}.scheme: must be http or https, got {scheme!r}")
            self._probe["scheme"] = scheme
        if "path" in params:
            path = _string(params["path"], f"{at}.path")
            if not path.startswith("/"):
                raise PickerConfigError(f"{at}.path: must start with /, got {path!r}")
            self._probe["path"] = path
        if "insecureSkipVerify" in params:
            self._probe["insecure_skip_verify"] = _bool(
                params["insecureSkipVerify"], f"{at}.insecureSkipVerify"
            )

    def _extractor_parameters(self, params: Mapping[str, Any], at: str) -> None:
        if "engineLabelKey" in params:
            self._probe["engine_label_key"] = _string(params["engineLabelKey"], f"{at}.engineLabelKey")
        engines = self._prober.engine_names()
        for i, entry in enumerate(_list(params.get("engineConfigs"), f"{at}.engineConfigs")):
            where = f"{at}.engineConfigs[{i}]"
            fields = _mapping(entry, where)
            _only(fields, frozenset(ENGINE_CONFIG_FIELDS), where)
            name = _string(fields.get("name"), f"{where}.name")
            where = f"{where} ({name!r})"
            specs: dict[str, str] = {}
            for key, setting in ENGINE_CONFIG_FIELDS.items():
                if key == "name" or key not in fields:
                    continue
                text = _string(fields[key], f"{where}.{key}", empty=True)
                if setting is None:
                    continue
                try:
                    parse_metric_spec(text)
                except ValueError as exc:
                    raise PickerConfigError(f"{where}.{key}: {exc}") from None
                specs[setting] = text
            # Fields left out are disabled, as upstream: an engine config is complete as written.
            names = MetricNames(
                queued_requests=specs.get("queued_requests", ""),
                running_requests=specs.get("running_requests", ""),
                kv_cache_usage=specs.get("kv_cache_usage", ""),
                kv_cache_usage_fallback="",
                lora_info=specs.get("lora_info", ""),
            )
            engines[name] = names
        default = self._prober.default_engine
        if "defaultEngine" in params:
            default = _string(params["defaultEngine"], f"{at}.defaultEngine")
            if default not in engines:
                raise PickerConfigError(
                    f"{at}.defaultEngine: {default!r} has no engine config "
                    f"(known: {', '.join(sorted(engines))})"
                )
        self._probe["default_engine"] = default
        self._probe["metric_names"] = engines[default]
        self._probe["engines"] = tuple(sorted(engines.items()))

    @staticmethod
    def _fraction(value: object, where: str) -> float:
        number = _number(value, where)
        if not 0 <= number <= 1:
            raise PickerConfigError(f"{where}: must be a number from 0 to 1, got {number:g}")
        return number
