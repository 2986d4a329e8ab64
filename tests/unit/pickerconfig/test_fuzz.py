"""Fuzzed EndpointPickerConfigs never start half-configured: the flags either give settings from which
a scheduler and every engine's metric plan build and a request is scheduled, or one clear error."""

from __future__ import annotations

import random
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.backend.metrics import compile_metric_names
from epp.pickerconfig import NOT_IMPLEMENTED, PLUGIN_TYPES
from epp.scheduling import LLMRequest, new_scheduler
from epp.server.flags import FlagError, parse_flags
from tests.unit.scheduling.pods import NOW, pm

# Mostly types that build, so that about half the documents load; the rest are errors of every kind.
SCHEDULING = ["queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "lora-affinity-scorer",
              "running-requests-size-scorer", "in-flight-scorer", "max-score-picker", "random-picker",
              "weighted-random-picker"]  # fmt: skip
TYPES = SCHEDULING * 4 + sorted(PLUGIN_TYPES) + sorted(NOT_IMPLEMENTED)[:3] + ["no-such-scorer"]
RARELY = st.sampled_from([False] * 7 + [True])
PARAMETERS = sorted({p for t in PLUGIN_TYPES.values() for p in t.parameters} | {"bogus"})
SCALARS = st.one_of(
    st.integers(-3, 300),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.booleans(),
    st.sampled_from(
        ["", "http", "https", "/metrics", "200ms", "2s", "vllm", "sglang", "q{a=b}", "x{", "soon"]
    ),
    st.none(),
)
ENGINE = st.fixed_dictionaries(
    {"name": st.sampled_from(["vllm", "sglang", "mine", ""])},
    optional={
        "queuedRequestsSpec": st.sampled_from(["q", "q{a=b}", "", "bad{"]),
        "kvUsageSpec": st.sampled_from(["kv", "", "1x"]),
        "loraSpec": st.sampled_from(["lora", ""]),
        "unknownSpec": st.just("x"),
    },
)
VALUES = st.one_of(SCALARS, st.lists(ENGINE, max_size=2), st.lists(SCALARS, max_size=2))
NAMES = st.sampled_from([None, None, "a", "b", "c"])


@st.composite
def plugin(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": draw(st.sampled_from(TYPES))}
    name = draw(NAMES)
    if name is not None:
        entry["name"] = name
    if draw(RARELY):
        entry["parameters"] = draw(st.dictionaries(st.sampled_from(PARAMETERS), VALUES, max_size=3))
    return entry


@st.composite
def document(draw: st.DrawFn) -> dict[str, Any]:
    plugins = draw(st.lists(plugin(), max_size=6))
    names = [p.get("name", p["type"]) for p in plugins] + ["missing"]
    refs = st.fixed_dictionaries(
        {"pluginRef": st.sampled_from(names)},
        optional={
            "weight": st.one_of(
                st.integers(0, 5),
                st.integers(0, 5),
                st.integers(-1, 5),
                st.floats(allow_nan=True, width=32),
                st.text(max_size=2),
            )
        },
    )
    doc: dict[str, Any] = {
        "apiVersion": "v1" if draw(RARELY) else "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
    }
    if draw(st.booleans()):
        doc["schedulingProfiles"] = draw(
            st.lists(
                st.fixed_dictionaries(
                    {"name": st.sampled_from(["default", "x"]), "plugins": st.lists(refs, max_size=5)}
                ),
                max_size=2,
            )
        )
    if draw(RARELY):
        doc["saturationDetector"] = {"pluginRef": draw(st.sampled_from(names))}
    if draw(RARELY):
        doc["featureGates"] = draw(
            st.lists(st.sampled_from(["flowControl", "dataLayer", "warp"]), max_size=2)
        )
    if draw(RARELY):
        doc["surprise"] = 1
    return doc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document())
def test_a_fuzzed_config_gives_a_whole_scheduler_or_one_clear_error(doc: dict[str, Any]) -> None:
    text = yaml.safe_dump(doc)
    try:
        flags = parse_flags(["--pool-name", "p", "--config-text", text], {})
    except FlagError as exc:
        message = str(exc)
        assert message.startswith("--config-text: "), message
        assert "\n" not in message
        assert len(message) < 600
        return
    config = flags.config
    # Everything the EPP builds at start from these settings builds, and works.
    for names in config.prober.engine_names().values():
        compile_metric_names(names)
    scheduler = new_scheduler(config.scheduler, random.Random(0), clock=lambda: NOW)
    pods = [pm("p1", queue=1, kv=0.1), pm("p2", queue=3, kv=0.5), pm("p3", queue=0, kv=0.9)]
    assert scheduler.schedule(LLMRequest("m", "m", critical=True), pods) in pods
    # A profile in the file is the profile that runs: as many scorers as it names.
    profiles = doc.get("schedulingProfiles") or []
    if profiles and config.scheduler.kind == "scorer":
        kinds = {p.get("name", p["type"]): PLUGIN_TYPES[p["type"]].role for p in doc["plugins"]}
        named = [r for r in profiles[0]["plugins"] if kinds[r["pluginRef"]] == "scorer"]
        assert len(config.scheduler.scoring_profile.scorers) == len(named)
