"""The consistency oracle names exactly one owner per modelName, in the EPP's order (DESIGN.md §6).

creationTimestamp has one-second resolution, so claimants created in the same second are ordered by
namespace/name. An oracle that accepted either owner on a tie could not catch an EPP that resolves the
tie one way live and another after a restart.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder
from harness.cluster.releases import V1, V1ALPHA2, Generation
from harness.verdicts.oracle import compare, expected_state, observed_state

NS = "ns1"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def pool(generation: Generation = V1ALPHA2) -> dict[str, Any]:
    return PoolBuilder("pool").namespace(NS).selector({"app": "vllm"}).port(8000).build(generation)


def model(name: str, age_s: int, generation: Generation = V1ALPHA2) -> dict[str, Any]:
    """The object that claims modelName llama: an InferenceModel, or in v1 the rewrite."""
    built = ModelBuilder(name).namespace(NS).model_name("llama").pool("pool")
    claim = built.created_at(T0 + timedelta(seconds=age_s)).objects(generation)[0][1]
    return claim


def view(owner: str) -> dict[str, Any]:
    """A /debug/datastore document holding the pool and `owner` for modelName llama."""
    return {
        "pool": {"namespace": NS, "name": "pool", "selector": {"app": "vllm"}, "targetPortNumber": 8000},
        "models": [{"namespace": NS, "name": owner, "modelName": "llama"}],
        "pods": [],
    }


@pytest.mark.parametrize(
    ("ages", "owner"),
    [
        pytest.param({"b": 5, "a": 5}, "a", id="tie-goes-to-the-first-name"),
        pytest.param({"a": 5, "b": 5}, "a", id="tie-in-either-listing-order"),
        pytest.param({"b": 4, "a": 5}, "b", id="older-wins-whatever-the-name"),
    ],
)
@pytest.mark.parametrize("generation", [V1ALPHA2, V1], ids=lambda g: g.name)
def test_the_oracle_expects_one_owner(ages: dict[str, int], owner: str, generation: Generation) -> None:
    models = [model(name, age, generation) for name, age in ages.items()]
    expected = expected_state(pool(generation), models, [], NS, "pool")
    assert expected.models == {"llama": f"{NS}/{owner}"}

    assert compare(expected, observed_state(view(owner))).consistent
    [other] = set(ages) - {owner}
    verdict = compare(expected, observed_state(view(other)))
    assert not verdict.consistent
    assert verdict.differences == (f"model 'llama': expected owner {NS}/{owner}, datastore has {NS}/{other}",)


def ready_pod(name: str, ip: str) -> dict[str, Any]:
    return PodBuilder(name).namespace(NS).labels(app="vllm").ready(ip).build()


def test_a_v1_pool_expects_every_pod_on_every_target_port() -> None:
    two_ports = PoolBuilder("pool").namespace(NS).selector(app="vllm").ports(8000, 8001).build(V1)
    expected = expected_state(two_ports, [], [ready_pod("p1", "127.0.9.1")], NS, "pool")
    assert (expected.target_port, expected.ports, expected.selector) == (8000, (8000, 8001), {"app": "vllm"})

    def endpoint_view(*ports: int) -> dict[str, Any]:
        pods = [{"namespace": NS, "name": "p1", "address": "127.0.9.1", "port": port} for port in ports]
        pool_view = {"namespace": NS, "name": "pool", "selector": {"app": "vllm"}, "targetPortNumber": 8000}
        return {"pool": pool_view, "models": [], "pods": pods}

    assert compare(expected, observed_state(endpoint_view(8000, 8001))).consistent
    stale = compare(expected, observed_state(endpoint_view(8000)))  # upstream #2306's other direction
    assert stale.differences == ("endpoint ns1/p1:8001: missing in the datastore",)


def test_a_v1_rewrite_bound_to_the_other_groups_pool_claims_nothing() -> None:
    """poolRef binds by group (upstream #1275): a rewrite for the x-k8s pool of the same name is not ours."""
    foreign = ModelBuilder("m").namespace(NS).model_name("llama").pool("pool", group=V1ALPHA2.pool_group)
    expected = expected_state(pool(V1), [foreign.rewrite()], [], NS, "pool")
    assert expected.models == {}
