"""The ext_proc servicer over a datastore filled from the v1 generation: endpoints per (pod, port),
the objective header, rewrites and the rewrite header (reference/upstream-v1.md §a, §c). The same
handlers serve v1alpha2 (every other test in this folder): nothing in them branches on the generation.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.handlers.request import MODEL_REWRITE_HEADER, OBJECTIVE_HEADER
from epp.metrics import UNKNOWN_MODEL
from tests.unit.api import objects

from .support import DEST, Env, body, exchange, headers, mutation, serving


def run_exchange(env: Env, *messages: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
    async def scenario() -> list[pb.ProcessingResponse]:
        async with serving(env.servicer()) as channel:
            result = await exchange(channel, messages)
            assert result.code == grpc.StatusCode.OK, result.details
            return result.replies

    return asyncio.run(scenario())


def request(model: str, **hdrs: str) -> tuple[pb.ProcessingRequest, pb.ProcessingRequest]:
    return headers(hdrs), body({"model": model, "prompt": "hi"})


@pytest.mark.parametrize(
    ("rank", "endpoint"), [(0, "10.0.0.1:8000"), (1, "10.0.0.1:8001"), (2, "10.0.0.1:8002")]
)
def test_each_rank_is_routed_on_its_own_port(rank: int, endpoint: str) -> None:
    env = Env().pool_v1(8000, 8001, 8002).pod("p1", "10.0.0.1")
    env.scheduler.pick, env.scheduler.pick_rank = "p1", rank
    replies = run_exchange(env, *request("llama"))
    assert mutation(replies[1]).metadata == {"envoy.lb": {DEST: endpoint}}
    # The scheduler saw every rank as an endpoint of its own.
    assert len(env.datastore.pod_get_all()) == 3


@pytest.mark.parametrize(
    ("hdrs", "critical"),
    [
        pytest.param({}, True, id="no-objective-priority-0"),
        pytest.param({OBJECTIVE_HEADER: "premium"}, True, id="positive"),
        pytest.param({OBJECTIVE_HEADER: "plain"}, True, id="unset-priority"),
        pytest.param({OBJECTIVE_HEADER: "bulk"}, False, id="negative-is-sheddable"),
        pytest.param({OBJECTIVE_HEADER: "unknown"}, True, id="unknown-objective-priority-0"),
    ],
)
def test_the_objective_header_decides_sheddability(hdrs: dict[str, str], critical: bool) -> None:
    env = Env().pool_v1().objective("premium", 10).objective("bulk", -1).objective("plain", None)
    env = env.pod("p1", "10.0.0.1")
    run_exchange(env, headers(hdrs), body({"model": "llama", "prompt": "hi"}))
    (sent,) = env.scheduler.requests
    assert sent.critical is critical


def test_an_unmatched_model_passes_unchanged_under_one_label() -> None:
    env = Env().pool_v1().pod("p1", "10.0.0.1")
    replies = run_exchange(env, *request("my-own-model"))
    m = mutation(replies[1])
    assert m.body is None  # nothing to rewrite
    assert m.metadata == {"envoy.lb": {DEST: "10.0.0.1:8000"}}
    labels = {"model_name": UNKNOWN_MODEL, "target_model_name": UNKNOWN_MODEL}
    assert env.sample("inference_model_request_total", labels) == 1


def test_a_rewrite_rule_rewrites_the_body_and_the_header_overrides_it() -> None:
    env = Env().pool_v1().pod("p1", "10.0.0.1")
    env.rewrite("r", objects.rule("llama", targets=[("llama-v2", 1)]))
    replies = run_exchange(env, *request("llama"))
    m = mutation(replies[1])
    assert m.body is not None
    assert json.loads(m.body)["model"] == "llama-v2"
    assert ("content-length", str(len(m.body))) in m.set_headers
    assert (
        env.sample("inference_model_request_total", {"model_name": "llama", "target_model_name": "llama-v2"})
        == 1
    )

    replies = run_exchange(env, *request("llama", **{MODEL_REWRITE_HEADER: "llama-canary"}))
    m = mutation(replies[1])
    assert m.body is not None
    assert json.loads(m.body)["model"] == "llama-canary"
    assert env.scheduler.requests[-1].target_model == "llama-canary"
