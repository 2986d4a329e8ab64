"""Fuzzed EndpointPickerConfigs never start half-configured: the flags either give settings from which
a scheduler and every engine's metric plan build and a request is scheduled, or one clear error."""

from __future__ import annotations

import random
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from epp.backend.metrics import compile_metric_names
from epp.pickerconfig import NOT_IMPLEMENTED, PLUGIN_TYPES
from epp.pickerconfig.plugins import TEST_FILTER
from epp.scheduling import LLMRequest, new_scheduler
from epp.server.flag_values import FlagError
from epp.server.flags import parse_flags
from tests.unit.scheduling.pods import NOW, pm

# Mostly types that build, so that about half the documents load; the rest are errors of every kind.
SCHEDULING = ["queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "lora-affinity-scorer",
              "running-requests-size-scorer", "in-flight-scorer", "max-score-picker", "random-picker",
              "weighted-random-picker"]  # fmt: skip
TYPES = SCHEDULING * 4 + sorted(PLUGIN_TYPES) + sorted(NOT_IMPLEMENTED)[:3] + ["no-such-scorer"]
# True about one time in sixteen: hypothesis's own choices lean towards edge cases, a seeded Random
# does not (and the seed still shrinks).
RARELY = st.integers(0, 2**32 - 1).map(lambda seed: random.Random(seed).random() < 0.06)
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
NAMES = st.integers(0, 2**32 - 1).map(
    lambda seed: random.Random(seed).choice([None, None, None, None, "a", "b"])
)


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
    # Mostly plugins with distinct names, and refs that exist: otherwise nearly every document would
    # end at the first duplicate or missing name.
    unique = None if draw(RARELY) else (lambda p: p.get("name", p["type"]))
    plugins = draw(st.lists(plugin(), max_size=5, unique_by=unique))
    names = [p.get("name", p["type"]) for p in plugins] + (["missing"] if draw(RARELY) or not plugins else [])
    weights = st.one_of(
        st.integers(0, 5),
        st.integers(0, 5),
        st.integers(0, 5),
        st.integers(-1, 5),
        st.floats(allow_nan=True, width=32),
        st.text(max_size=2),
    )
    doc: dict[str, Any] = {
        "apiVersion": "v1" if draw(RARELY) else "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
    }
    if draw(st.booleans()):
        # Mostly one profile naming each plugin at most once (what loads); sometimes none, two, or
        # one naming a plugin twice.
        profiles = []
        for _ in range(random.Random(draw(st.integers(0, 2**32 - 1))).choice([1, 1, 1, 1, 1, 0, 2])):
            chosen = draw(
                st.lists(
                    st.sampled_from(names),
                    unique=not draw(RARELY),
                    min_size=int(not draw(RARELY)),
                    max_size=5,
                )
            )
            listed = []
            for ref in chosen:
                entry: dict[str, Any] = {"pluginRef": ref}
                if draw(st.booleans()):
                    entry["weight"] = draw(weights)
                listed.append(entry)
            profiles.append({"name": draw(st.sampled_from(["default", "x"])), "plugins": listed})
        doc["schedulingProfiles"] = profiles
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
@example(  # found by a CI run: a profile of the test filter alone keeps the flags' scheduler
    doc={
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "header-based-testing-filter"}],
        "schedulingProfiles": [
            {"name": "default", "plugins": [{"pluginRef": "header-based-testing-filter"}]},
        ],
    }
)
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
        roles = [kinds[r["pluginRef"]] for r in profiles[0]["plugins"]]
        if any(role != TEST_FILTER for role in roles):
            assert len(config.scheduler.scoring_profile.scorers) == roles.count("scorer")
        else:  # the test filter alone changes no scoring: the scheduler stays as the flags chose it
            assert config.scheduler.profile is None


# --- valid documents, and one mutation that must turn each into an error ---------------------------
SCORER_TYPES = [t for t, kind in sorted(PLUGIN_TYPES.items()) if kind.role == "scorer"]
PICKER_TYPES = [t for t, kind in sorted(PLUGIN_TYPES.items()) if kind.role == "picker"]
GOOD_WEIGHTS = st.one_of(st.integers(0, 10), st.floats(0, 10, allow_nan=False))


@st.composite
def valid_document(draw: st.DrawFn) -> dict[str, Any]:
    scorers = draw(st.lists(st.sampled_from(SCORER_TYPES), min_size=1, max_size=4, unique=True))
    pickers = draw(st.lists(st.sampled_from(PICKER_TYPES), max_size=1))
    plugins: list[dict[str, Any]] = [{"type": t, "name": f"my-{t}"} for t in scorers + pickers]
    plugins += draw(
        st.sampled_from([[], [{"type": "metrics-data-source"}, {"type": "core-metrics-extractor"}]])
    )
    refs: list[dict[str, Any]] = []
    for t in scorers:
        ref: dict[str, Any] = {"pluginRef": f"my-{t}"}
        if draw(st.booleans()):
            ref["weight"] = draw(GOOD_WEIGHTS)
        refs.append(ref)
    refs += [{"pluginRef": f"my-{t}"} for t in pickers]
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": draw(st.permutations(refs))}],
    }


def _first_scorer_ref(doc: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in doc["schedulingProfiles"][0]["plugins"] if "picker" not in r["pluginRef"])


def _mutate(name: str, doc: dict[str, Any]) -> None:
    profile = doc["schedulingProfiles"][0]
    if name == "unknown-type":
        doc["plugins"][0]["type"] = "magic-scorer"
    elif name == "not-implemented-type":
        doc["plugins"][0]["type"] = "latency-scorer"
    elif name == "missing-ref":
        profile["plugins"].append({"pluginRef": "nowhere"})
    elif name in ("negative-weight", "nan-weight", "text-weight", "bool-weight", "inf-weight"):
        value = {"negative-weight": -0.5, "nan-weight": float("nan"), "text-weight": "2", "bool-weight": True}
        _first_scorer_ref(doc)["weight"] = value.get(name, float("inf"))
    elif name == "duplicate-name":
        doc["plugins"].append(dict(doc["plugins"][0]))
    elif name == "two-profiles":
        doc["schedulingProfiles"].append({"name": "second", "plugins": list(profile["plugins"])})
    elif name == "second-picker":
        doc["plugins"] += [
            {"type": "random-picker", "name": "p1"},
            {"type": "max-score-picker", "name": "p2"},
        ]
        profile["plugins"] += [{"pluginRef": "p1"}, {"pluginRef": "p2"}]
    elif name == "weight-on-picker":
        doc["plugins"].append({"type": "random-picker", "name": "wp"})
        profile["plugins"].append({"pluginRef": "wp", "weight": 1})
    elif name == "unknown-parameter":
        doc["plugins"][0]["parameters"] = {"speed": 11}
    elif name == "unknown-field":
        doc["pluginz"] = []
    elif name == "unknown-gate":
        doc["featureGates"] = ["warp"]
    elif name == "tree-with-scorers":
        doc["plugins"].append({"type": "filter-tree"})
        profile["plugins"].append({"pluginRef": "filter-tree"})
    else:  # pragma: no cover - the list below and this function go together
        raise AssertionError(name)


MUTATIONS = [
    "unknown-type", "not-implemented-type", "missing-ref", "negative-weight", "nan-weight", "text-weight",
    "bool-weight", "inf-weight", "duplicate-name", "two-profiles", "second-picker", "weight-on-picker",
    "unknown-parameter", "unknown-field", "unknown-gate", "tree-with-scorers",
]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(valid_document(), st.sampled_from([None, *MUTATIONS]))
def test_a_valid_config_runs_as_written_and_any_one_mistake_stops_it(
    doc: dict[str, Any], mutation: str | None
) -> None:
    expected = [
        (PLUGIN_TYPES[r["pluginRef"].removeprefix("my-")].ours, float(r.get("weight", 1)))
        for r in doc["schedulingProfiles"][0]["plugins"]
        if "picker" not in r["pluginRef"]
    ]
    pickers = [
        r["pluginRef"].removeprefix("my-")
        for r in doc["schedulingProfiles"][0]["plugins"]
        if "picker" in r["pluginRef"]
    ]
    if mutation is not None:
        _mutate(mutation, doc)
    argv = ["--pool-name", "p", "--config-text", yaml.safe_dump(doc)]
    if mutation is not None:
        with pytest.raises(FlagError, match=r"^--config-text: ") as info:
            parse_flags(argv, {})
        assert "\n" not in str(info.value), mutation
        return
    profile = parse_flags(argv, {}).config.scheduler.scoring_profile
    assert [(s.kind, s.weight) for s in profile.scorers] == expected
    assert profile.picker == (PLUGIN_TYPES[pickers[0]].ours if pickers else "max-score")
