"""A pool's ``targetPorts`` change under a running EPP (data-parallel ranks: one endpoint per pod and
port). Upstream #2306 (fixed by PR #2308): after the list shrank, the endpoints of the removed ranks
stayed routable. Only an InferencePool v1 has ``targetPorts`` (v1alpha2 has one ``targetPortNumber``),
so the scenario is not applicable to a run on v1alpha2's CRDs.

Each pod runs a simulator on each port; which rank answered a request is the ``ip:port`` the
simulator names (``x-served-by``). A round is the traffic oracle's number of requests for that many
endpoints (`harness.verdicts.traffic_oracle.requests_needed`: each routable endpoint is seen with
probability >= 1 - 1e-5), each with a fresh prompt so no prefix affinity narrows the pick.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Collection

import httpx2
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, ModelSpec, Stack
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import CLIENT_TIMEOUT_S, cluster_of, served_by
from harness.verdicts.traffic_oracle import requests_needed

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic, pytest.mark.api_generation("v1")]

MODEL = "base"
MODELS = (ModelSpec(MODEL, MODEL, "Critical", ((BASE_MODEL, None),)),)
PORTS = (8000, 8001)
PODS = ("ranked-a", "ranked-b")
CONVERGE_S = 30.0


def serve_round(stack: Stack, candidates: int) -> Counter[str]:
    """One round of requests; how many each ``ip:port`` answered. Every request must be served."""
    cluster = cluster_of(stack)
    served: Counter[str] = Counter()
    with httpx2.Client(base_url=stack.base_url, timeout=CLIENT_TIMEOUT_S) as http:
        model = stack.model_for(MODEL)
        for _ in range(requests_needed(candidates)):
            body = {"model": model, "prompt": f"rank {uuid.uuid4().hex}", "max_tokens": 1}
            response = http.post("/completions", json=body, headers=cluster.objective_headers(model))
            assert response.status_code == 200, f"{response.status_code} {response.text!r}"
            served[served_by(response.headers)] += 1
    return served


def eventually_serves_exactly(stack: Stack, endpoints: Collection[str], candidates: int, what: str) -> None:
    """Rounds until one is answered by exactly ``endpoints``: each of them, and nothing else."""

    def check() -> None:
        served = serve_round(stack, candidates)
        assert set(served) == set(endpoints), (
            f"served by {dict(sorted(served.items()))}; expected exactly {sorted(endpoints)}"
        )

    eventually(check, timeout=CONVERGE_S, message=what)


def test_a_removed_target_port_gets_no_traffic_and_an_added_one_does(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=0, models=MODELS)
    cluster = cluster_of(stack)
    cluster.apply_pool(port=PORTS)
    cluster.add_pods([cluster.pod_body(name, ports=PORTS) for name in PODS])
    ranks = {port: {f"{cluster.pods[name].ip}:{port}" for name in PODS} for port in PORTS}
    every_rank = set().union(*ranks.values())
    kept, removed = PORTS
    eventually_serves_exactly(stack, every_rank, len(every_rank), "every rank of every pod serves")

    cluster.apply_pool(port=(kept,))
    # A round with nothing on the removed port can only come after the EPP applied the shrink (the
    # rounds before it reached that port); the next round shows it stays that way.
    eventually_serves_exactly(stack, ranks[kept], len(every_rank), f"no request reaches :{removed}")
    before = {name: sum(cluster.sim(name, removed).requests_by_model().values()) for name in PODS}
    again = serve_round(stack, len(every_rank))
    assert set(again) == ranks[kept], f"after the shrink had shown, served by {dict(sorted(again.items()))}"
    after = {name: sum(cluster.sim(name, removed).requests_by_model().values()) for name in PODS}
    assert after == before, f"the simulators on :{removed} were still sent requests"

    cluster.apply_pool(port=PORTS)
    eventually_serves_exactly(stack, every_rank, len(every_rank), f":{removed} serves again once re-added")
