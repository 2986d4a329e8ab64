"""A pool resync racing pod churn must not drop a Ready pod for good (llm-d-router #2060, fixed by its
PR #2092): a selector change re-lists the pool's pods while pod reconciles run, and a resync that
applied a list from before the latest changes removed Ready pods that then had no event of their own
left to bring them back. Upstream-v1.md §g.3.

The pool's selector flips between two label sets while one pod has just become Ready and another is
being deleted; in the end every Ready pod the last selector picks must take traffic, though none of
them changes again after the flips (only a resync can have put them back).
"""

from __future__ import annotations

import pytest

from harness.beds.stack import BASE_MODEL, ModelSpec
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import cluster_of

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic]

MODEL = "base"
MODELS = (ModelSpec(MODEL, MODEL, "Critical", ((BASE_MODEL, None),)),)
CONVERGE_S = 30.0


def test_a_pool_resync_racing_pod_churn_leaves_every_ready_pod_routable(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2, models=MODELS)
    cluster = cluster_of(stack)
    assert stack.traffic is not None
    leaving, staying = sorted(cluster.pods)
    base = cluster.pool_selector()
    one, two = {**base, "wave": "one"}, {**base, "wave": "two"}
    cluster.pod_labels(leaving, {"wave": "one"})
    cluster.pod_labels(staying, {"wave": "two"})
    cluster.add_pod("just-ready", two)  # Ready right before the flips

    cluster.apply_pool(selector=one)
    cluster.terminate_pod(leaving)  # deleted between two resyncs
    cluster.apply_pool(selector=two)
    cluster.apply_pool(selector=one)
    cluster.apply_pool(selector=two)

    verdict = stack.traffic.eventually_routes_to(timeout=CONVERGE_S)
    assert verdict.expected == {staying, "just-ready"}, f"the API's members are {sorted(verdict.expected)}"
