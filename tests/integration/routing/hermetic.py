"""The upstream hermetic test's objects (epp-behaviour.md §8.2), created through the API server.

Pool on port 8000, selector `app: <pool>`; three Ready pods `pod-0..2`, each with its own simulator
(whose gauges stand in for upstream's fake metrics client); the four models of
`inferencepool-with-model-hermetic.yaml`. `sql-lora-sheddable` is explicitly Sheddable here (upstream
left it unset, which v0.3.0 treats the same way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.beds.testbed import TestBed

MY_MODEL = "my-model"
MY_MODEL_TARGET = "my-model-12345"
SQL_LORA = "sql-lora"
SQL_LORA_TARGET = "sql-lora-1fdg2"
SHEDDABLE = "sql-lora-sheddable"
SHEDDABLE_TARGET = "sql-lora-1fdg3"
DIRECT = "direct-model"
PODS = ("pod-0", "pod-1", "pod-2")


def build(testbed: TestBed) -> TestBed:
    """The EPP, then the pool, the models and the pods, each step checked by the oracle."""
    testbed.start_epp()
    testbed.eventually_consistent()
    testbed.apply_pool()
    testbed.eventually_consistent()
    for name, model_name, criticality, target in (
        ("sql-lora", SQL_LORA, "Critical", SQL_LORA_TARGET),
        ("sql-lora-sheddable", SHEDDABLE, "Sheddable", SHEDDABLE_TARGET),
        ("my-model", MY_MODEL, "Critical", MY_MODEL_TARGET),
        ("direct-model", DIRECT, "Critical", None),
    ):
        targets = [(target, 100)] if target else []
        testbed.apply_model(name, model_name, criticality=criticality, targets=targets)
        testbed.eventually_consistent()
    for pod in PODS:
        testbed.cluster.add_pods([testbed.cluster.pod_body(pod)])
        testbed.eventually_consistent()
    return testbed


def load(bed: TestBed, gauges: Sequence[Mapping[str, Any]]) -> None:
    """Pin each pod's gauges (pod-i gets gauges[i]) and wait until the datastore shows all of them."""
    for pod, pinned in zip(PODS, gauges, strict=True):
        bed.set_gauges(pod, **pinned)
    for pod, pinned in zip(PODS, gauges, strict=True):
        bed.eventually_gauges(pod, **pinned)
