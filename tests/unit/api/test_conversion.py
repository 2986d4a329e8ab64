"""Both API generations into the one shape (epp.api.v1, epp.api.v1alpha2): table tests per field.

Facts: reference/upstream-v1.md §a (v1), epp-behaviour.md §1 (v1alpha2).
"""

from __future__ import annotations

from typing import Any

import pytest

from epp.api import generation as gen
from epp.api import v1, v1alpha2
from epp.api.types import (
    V1_GROUP,
    V1ALPHA2_GROUP,
    Criticality,
    EndpointPickerRef,
    NamespacedName,
    PoolRef,
    RewriteRule,
    TargetModel,
)
from harness.cluster.builders import ModelBuilder, PoolBuilder

from . import objects


# --- InferencePool ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(
            objects.pool_v1(ports=(8000,)),
            {"selector": {"app": "vllm"}, "target_ports": (8000,), "app_protocol": "http", "group": V1_GROUP},
            id="v1-one-port-default-protocol",
        ),
        pytest.param(
            objects.pool_v1(
                ports=(8000, 8001, 8002), selector={"a": "1", "b": "2"}, app_protocol="kubernetes.io/h2c"
            ),
            {
                "selector": {"a": "1", "b": "2"},
                "target_ports": (8000, 8001, 8002),
                "app_protocol": "kubernetes.io/h2c",
            },
            id="v1-ranks-and-h2c",
        ),
        pytest.param(
            objects.pool_v1(picker={"name": "epp", "port": {"number": 9002}}),
            {"endpoint_picker": EndpointPickerRef("epp", port=9002), "declared_models_only": False},
            id="v1-picker-ref-defaults",
        ),
        pytest.param(
            objects.pool_v1(
                picker={"name": "epp", "kind": "Service", "group": "", "failureMode": "FailOpen"}
            ),
            {"endpoint_picker": EndpointPickerRef("epp", failure_mode="FailOpen")},
            id="v1-picker-ref-fail-open",
        ),
        pytest.param(objects.pool_v1(deleting=True), {"deleting": True}, id="v1-deleting"),
    ],
)
def test_v1_pool(obj: dict[str, Any], expected: dict[str, object]) -> None:
    pool = v1.pool_from_api(obj)
    assert pool.key == NamespacedName("ns1", "pool")
    assert {k: getattr(pool, k) for k in expected} == expected


def test_v1_pool_without_ports_is_refused() -> None:
    obj = objects.pool_v1()
    obj["spec"]["targetPorts"] = []
    with pytest.raises(ValueError, match="targetPorts"):
        v1.pool_from_api(obj)


def test_v1alpha2_pool() -> None:
    obj = PoolBuilder("pool").namespace("ns1").selector(app="x").port(8123).extension_ref("epp").build()
    pool = v1alpha2.pool_from_api(obj)
    assert (pool.selector, pool.target_ports, pool.group, pool.app_protocol) == (
        {"app": "x"},
        (8123,),
        V1ALPHA2_GROUP,
        "http",
    )
    assert pool.declared_models_only  # v0.3.0: a model no InferenceModel names is 404
    assert pool.target_port == 8123  # the debug view's targetPortNumber


def test_selector_is_a_copy() -> None:
    """Upstream #804: a snapshot that aliases the cache's dict changes under the reader's feet."""
    obj = objects.pool_v1()
    pool = v1.pool_from_api(obj)
    obj["spec"]["selector"]["matchLabels"]["app"] = "changed"
    assert pool.selector == {"app": "vllm"}


# --- binding --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ref", "binds_v1", "binds_v1alpha2"),
    [
        pytest.param(objects.pool_ref(), True, False, id="default-group-is-v1"),
        pytest.param(objects.pool_ref(group=V1_GROUP), True, False, id="explicit-v1"),
        pytest.param(objects.pool_ref(group=V1ALPHA2_GROUP), False, True, id="x-k8s-group-issue-1275"),
        pytest.param(objects.pool_ref(kind="Service"), False, False, id="other-kind"),
        pytest.param(objects.pool_ref(name="other"), False, False, id="other-name"),
    ],
)
def test_objective_binds_by_group_kind_and_name(
    ref: dict[str, str], binds_v1: bool, binds_v1alpha2: bool
) -> None:
    objective = v1.objective_from_api(objects.objective("o", ref=ref))
    pool_v1 = v1.pool_from_api(objects.pool_v1())
    pool_old = v1alpha2.pool_from_api(PoolBuilder("pool").namespace("ns1").selector(app="x").port(1).build())
    assert (pool_v1.binds(objective.pool_ref), pool_old.binds(objective.pool_ref)) == (
        binds_v1,
        binds_v1alpha2,
    )


@pytest.mark.parametrize(
    ("group", "binds"),
    [
        pytest.param(None, True, id="unset-is-this-generation"),
        pytest.param(V1ALPHA2_GROUP, True, id="explicit-x-k8s"),
        pytest.param(V1_GROUP, False, id="same-named-v1-pool-issue-1275"),
    ],
)
def test_inference_model_binds_by_group_and_name(group: str | None, binds: bool) -> None:
    """v0.3.0 ignored poolRef.group (epp-behaviour.md §1): a model of the same-named v1 pool bound to
    the v1alpha2 one (upstream #1275). The group is kept; ``kind`` is still ignored, as in v0.3.0."""
    builder = ModelBuilder("m").namespace("ns1").model_name("llama")
    obj = (builder.pool("pool") if group is None else builder.pool("pool", group=group)).build()
    obj["spec"]["poolRef"]["kind"] = "SomethingElse"
    model = v1alpha2.model_from_api(obj)
    pool = v1alpha2.pool_from_api(PoolBuilder("pool").namespace("ns1").selector(app="x").port(1).build())
    assert pool.binds(model.pool_ref) is binds


# --- InferenceObjective -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("priority", "effective", "sheddable"),
    [
        pytest.param(None, 0, False, id="unset-is-0"),
        pytest.param(0, 0, False, id="zero"),
        pytest.param(100, 100, False, id="positive"),
        pytest.param(-1, -1, True, id="negative-is-sheddable"),
    ],
)
def test_objective_priority(priority: int | None, effective: int, sheddable: bool) -> None:
    objective = v1.objective_from_api(objects.objective("chat", priority))
    assert objective.priority == priority
    assert (objective.effective_priority, objective.sheddable) == (effective, sheddable)
    assert objective.pool_ref == PoolRef(V1_GROUP, "pool")


# --- InferenceModelRewrite ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw_rules", "rules"),
    [
        pytest.param(
            [objects.rule("llama", targets=[("a", 30), ("b", 70)])],
            (RewriteRule(("llama",), (TargetModel("a", 30), TargetModel("b", 70))),),
            id="exact-weighted",
        ),
        pytest.param(
            [objects.rule(targets=[("any", None)])],
            (RewriteRule((), (TargetModel("any"),)),),
            id="empty-matches-is-catch-all",
        ),
        pytest.param(
            [objects.rule("a", "b", targets=[("x", 1)])],
            (RewriteRule(("a", "b"), (TargetModel("x", 1),)),),
            id="several-matches-or",
        ),
        pytest.param(
            [
                {
                    "matches": [{"model": {"type": "Prefix", "value": "ll"}}],
                    "targets": [{"modelRewrite": "x"}],
                },
                objects.rule("llama", targets=[("y", 1)]),
            ],
            (RewriteRule(("llama",), (TargetModel("y", 1),)),),
            id="unknown-match-type-matches-nothing-not-everything",
        ),
        pytest.param(
            [{"matches": [{"model": {"value": "llama"}}], "targets": [{"modelRewrite": "x"}]}],
            (RewriteRule(("llama",), (TargetModel("x"),)),),
            id="type-defaults-to-exact",
        ),
    ],
)
def test_rewrite_rules(raw_rules: list[dict[str, Any]], rules: tuple[RewriteRule, ...]) -> None:
    rewrite = v1.rewrite_from_api(objects.rewrite("r", *raw_rules, age_s=7))
    assert rewrite.rules == rules
    assert rewrite.objective is None  # v1: the objective comes from the request's header
    assert rewrite.claim_order[1] == NamespacedName("ns1", "r")


# --- InferenceModel (v1alpha2) --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("criticality", "priority", "sheddable"),
    [
        pytest.param("Critical", 1, False, id="critical"),
        pytest.param("Standard", -1, True, id="standard-is-sheddable-in-v0.3"),
        pytest.param(None, -1, True, id="unset-as-standard"),
        pytest.param("Sheddable", -2, True, id="sheddable"),
    ],
)
def test_inference_model_criticality_becomes_a_priority(
    criticality: str | None, priority: int, sheddable: bool
) -> None:
    builder = ModelBuilder("m").namespace("ns1").model_name("llama").pool("pool")
    if criticality:
        builder = builder.criticality(criticality)
    rewrite = v1alpha2.model_from_api(builder.build())
    assert rewrite.objective is not None
    assert (rewrite.objective.priority, rewrite.objective.sheddable) == (priority, sheddable)
    assert rewrite.objective.criticality == (Criticality(criticality) if criticality else None)


@pytest.mark.parametrize(
    ("targets", "rule"),
    [
        pytest.param([], RewriteRule(("llama",)), id="no-targets-passthrough"),
        pytest.param(
            [("a", 1), ("b", None)],
            RewriteRule(("llama",), (TargetModel("a", 1), TargetModel("b"))),
            id="targets",
        ),
    ],
)
def test_inference_model_targets_become_one_exact_rule(
    targets: list[tuple[str, int | None]], rule: RewriteRule
) -> None:
    builder = ModelBuilder("m").namespace("ns1").model_name("llama").pool("pool")
    for name, weight in targets:
        builder = builder.target(name, weight=weight)
    assert v1alpha2.model_from_api(builder.build()).rules == (rule,)


# --- which kinds each group watches ---------------------------------------------------------------
def test_generations() -> None:
    v1_kinds = gen.generation(V1_GROUP)
    assert (v1_kinds.pool.group, v1_kinds.pool.version, v1_kinds.pool.optional) == (V1_GROUP, "v1", False)
    assert [(k.plural, k.group, k.optional) for k in v1_kinds.rules] == [
        ("inferenceobjectives", V1ALPHA2_GROUP, True),
        ("inferencemodelrewrites", V1ALPHA2_GROUP, True),
    ]
    old = gen.generation(V1ALPHA2_GROUP)
    assert [(k.plural, k.optional) for k in (old.pool, *old.rules)] == [
        ("inferencepools", False),
        ("inferencemodels", False),
    ]
    with pytest.raises(ValueError, match="unknown pool group"):
        gen.generation("example.com")
