"""The consistency oracle names exactly one owner per modelName, in the EPP's order (DESIGN.md §6).

creationTimestamp has one-second resolution, so claimants created in the same second are ordered by
namespace/name. An oracle that accepted either owner on a tie could not catch an EPP that resolves the
tie one way live and another after a restart.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from harness.cluster.builders import ModelBuilder, PoolBuilder
from harness.verdicts.oracle import compare, expected_state, observed_state

NS = "ns1"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def pool() -> dict[str, Any]:
    return PoolBuilder("pool").namespace(NS).selector({"app": "vllm"}).port(8000).build()


def model(name: str, age_s: int) -> dict[str, Any]:
    built = ModelBuilder(name).namespace(NS).model_name("llama").pool("pool")
    return built.created_at(T0 + timedelta(seconds=age_s)).build()


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
def test_the_oracle_expects_one_owner(ages: dict[str, int], owner: str) -> None:
    models = [model(name, age) for name, age in ages.items()]
    expected = expected_state(pool(), models, [], NS, "pool")
    assert expected.models == {"llama": f"{NS}/{owner}"}

    assert compare(expected, observed_state(view(owner))).consistent
    [other] = set(ages) - {owner}
    verdict = compare(expected, observed_state(view(other)))
    assert not verdict.consistent
    assert verdict.differences == (f"model 'llama': expected owner {NS}/{owner}, datastore has {NS}/{other}",)
