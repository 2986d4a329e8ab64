"""What belongs to a pool, and what does not, when its neighbours look alike (upstream-v1.md §g):

* two pools in one namespace, an EPP each (upstream #946, #724, #252): neither EPP ever picks the
  other pool's pods;
* same-named pools in two API groups (upstream #1275): objectives and rewrites (v1alpha2: models)
  whose ``poolRef`` names a pool of our name in the *other* group are not ours; #1275 bound by name
  alone, so those of a v1 pool applied to a v1alpha2 pool ``ns/p`` (and v0.3.0 ignores
  ``poolRef.group`` altogether: epp-behaviour.md §1.3).

The negative checks are settled by traffic: each ends on a write the EPP must have applied, after
the write that could make it go wrong, on the same watch (one watch delivers its events in order).
"""

from __future__ import annotations

import dataclasses

import httpx2
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, ModelSpec, Stack
from harness.cluster.builders import ModelBuilder
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.releases import V1, V1ALPHA2
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import CLIENT_TIMEOUT_S, cluster_of, skip_unless_two_can_run
from harness.subject.foreign_epp import EppCommand

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic]

MODEL = "base"
MODELS = (ModelSpec(MODEL, MODEL, "Critical", ((BASE_MODEL, None),)),)
OTHER_POOL = "other-pool"
OTHER_MODELS = (ModelSpec("other-base", "other-base", "Critical", ((BASE_MODEL, None),)),)
CONVERGE_S = 30.0


def complete(stack: Stack, model: str) -> httpx2.Response:
    """One completion for ``model``, naming its objective in v1 (what its client would send)."""
    with httpx2.Client(base_url=stack.base_url, timeout=CLIENT_TIMEOUT_S) as http:
        body = {"model": model, "prompt": "whose model is this", "max_tokens": 1}
        return http.post("/completions", json=body, headers=cluster_of(stack).objective_headers(model))


def test_two_pools_in_one_namespace_each_with_its_epp_never_pick_each_others_pods(
    stack_factory: StackFactory, control_plane: ClusterAccess, epp_command: EppCommand | None
) -> None:
    skip_unless_two_can_run(epp_command)
    stack = stack_factory(pods=1, models=MODELS)  # one pod each is enough to be picked wrongly
    options = dataclasses.replace(stack.options, pool_name=OTHER_POOL, models=OTHER_MODELS)
    with Stack(control_plane, options) as other:
        ours, theirs = cluster_of(stack), cluster_of(other)
        assert not set(ours.pods) & set(theirs.pods)
        assert stack.traffic is not None
        assert other.traffic is not None
        # The other EPP listed our pods at its start: its rounds mean something at once. Ours saw the
        # other pool's pods arrive as events; one more pod of ours, after them, is the write it must
        # have applied (a round reaches it) before a round without the other's pods counts.
        ours.add_pod(f"{ours.pool_name}-late")
        for traffic, cluster in ((stack.traffic, ours), (other.traffic, theirs)):
            # A request answered by the other pool's pod counts as "answered by no pod of the pool".
            verdict = traffic.eventually_routes_to(sorted(cluster.pods), timeout=CONVERGE_S)
            assert verdict.served_by_unknown == 0


OTHER_GROUP = {V1.name: V1ALPHA2.pool_group, V1ALPHA2.name: V1.pool_group}


@pytest.mark.needs("model-aware-routing")
@pytest.mark.upstream_bug("1275-objects-bind-by-pool-name")
def test_what_binds_to_a_same_named_pool_of_the_other_api_group_never_applies(
    stack_factory: StackFactory,
) -> None:
    stack = stack_factory(pods=2, models=MODELS)
    cluster = cluster_of(stack)
    other_group = OTHER_GROUP[cluster.generation.name]
    theirs = (
        ModelBuilder("theirs").namespace(cluster.namespace).model_name("theirs").criticality("Critical")
        .pool(cluster.pool_name, group=other_group).target(BASE_MODEL)
    )  # fmt: skip
    for kind, body in theirs.objects(cluster.generation):
        cluster.kube.model_client(kind).create(cluster.namespace, body)
    # Ours, written after theirs on the same watch: once it is served, theirs was seen too.
    cluster.apply_model("mine", criticality="Critical", targets=((BASE_MODEL, None),))

    def mine_served() -> None:
        response = complete(stack, "mine")
        assert response.status_code == 200, f"mine: {response.status_code} {response.text!r}"

    eventually(mine_served, timeout=CONVERGE_S, message="the model bound to our pool is served")
    response = complete(stack, "theirs")
    assert response.status_code != 200, (
        f"'theirs' (bound to {other_group}/{cluster.pool_name}) was served as {BASE_MODEL} by this pool"
    )
