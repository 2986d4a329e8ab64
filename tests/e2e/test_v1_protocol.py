"""The v1 request protocol through a real Envoy set up as upstream's test envoy.yaml (v1.0.0 … v1.5.0):
request and response bodies FULL_DUPLEX_STREAMED, response headers and trailers SEND, message
timeout 1000 s (`EnvoyOptions.v1`).

In full duplex Envoy forwards only what the EPP hands back, so a response that arrives whole proves
the EPP echoed every chunk; the EPP's token counters prove it still read the usage (JSON and SSE).
The subset hint comes from a test header that Envoy turns into the `envoy.lb.subset_hint` metadata
(`EnvoyOptions.subset_hint_header`), as a gateway would set it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx2
import pytest

from harness.beds.stack import BASE_MODEL, Stack, StackOptions
from harness.dataplane.envoy import EnvoyOptions
from harness.plugin.core import namespace_name
from harness.scenarios.support import (
    CLIENT_TIMEOUT_S,
    cluster_of,
    endpoint,
    http_error_text,
    served_by,
    wait_routable,
)
from harness.sim import SimConfig

pytestmark = [pytest.mark.e2e]

SUBSET_HEADER = "x-test-subset"
PODS = 3
MODEL = BASE_MODEL  # served as itself (the demo's "llama"): no LoRA affinity steers it
TOKENS = re.compile(r"^inference_(?:model|objective)_(input|output)_tokens_sum\{[^}]*\} (\S+)$", re.M)


@pytest.fixture(scope="module")
def shared_stack_options(request: pytest.FixtureRequest) -> StackOptions:
    sim = SimConfig(model=BASE_MODEL, max_num_seqs=8, time_scale=0.001)
    return StackOptions(
        namespace=namespace_name(request.module.__name__),
        pods=PODS,
        sim_config=sim,
        envoy=EnvoyOptions.v1(subset_hint_header=SUBSET_HEADER),
    )


@pytest.fixture
def http(shared_stack: Stack) -> Iterator[httpx2.Client]:
    wait_routable(shared_stack, sorted(cluster_of(shared_stack).pods))
    with httpx2.Client(base_url=shared_stack.base_url, timeout=CLIENT_TIMEOUT_S) as client:
        yield client


def token_sums(stack: Stack) -> tuple[float, float]:
    """(input, output) tokens the EPP has counted so far, over every model."""
    sums = {"input": 0.0, "output": 0.0}
    for kind, value in TOKENS.findall(stack.epp_metrics_text()):
        sums[kind] += float(value)
    return sums["input"], sums["output"]


def completion(stream: bool, n: int = 0) -> dict[str, object]:
    # Each `n` its own prompt start: no prefix memory steers a run of requests to one pod.
    body: dict[str, object] = {"model": MODEL, "prompt": f"{n} Say hi to the v1 protocol", "max_tokens": 5}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def test_a_json_response_comes_through_whole_and_its_usage_is_counted(
    shared_stack: Stack, http: httpx2.Client
) -> None:
    before = token_sums(shared_stack)
    response = http.post("/completions", json=completion(stream=False))
    assert response.status_code == 200, http_error_text(response)
    usage = response.json()["usage"]
    assert usage["completion_tokens"] > 0
    after = token_sums(shared_stack)
    assert (after[0] - before[0], after[1] - before[1]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


def test_an_sse_response_comes_through_whole_and_its_usage_is_counted(
    shared_stack: Stack, http: httpx2.Client
) -> None:
    before = token_sums(shared_stack)
    with http.stream("POST", "/completions", json=completion(stream=True)) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2][len("data: ") :])["usage"]
    after = token_sums(shared_stack)
    assert (after[0] - before[0], after[1] - before[1]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


def test_a_header_only_request_is_routed_to_a_pool_pod(shared_stack: Stack, http: httpx2.Client) -> None:
    response = http.get("/models")
    assert response.status_code == 200, http_error_text(response)
    assert served_by(response.headers) in {
        endpoint(shared_stack, pod) for pod in cluster_of(shared_stack).pods
    }


@pytest.mark.parametrize("form", ["ip", "ip-port"])
def test_the_subset_hint_confines_the_pick(shared_stack: Stack, http: httpx2.Client, form: str) -> None:
    pods = sorted(cluster_of(shared_stack).pods)
    allowed = endpoint(shared_stack, pods[1])
    hint = allowed if form == "ip-port" else allowed.rsplit(":", 1)[0]
    served = set()
    for n in range(12):
        response = http.post("/completions", json=completion(False, n), headers={SUBSET_HEADER: hint})
        assert response.status_code == 200, http_error_text(response)
        served.add(served_by(response.headers))
    assert served == {allowed}
    # Without the hint the same requests spread: the pick above was the hint's doing.
    spread = {
        served_by(http.post("/completions", json=completion(False, n)).headers) for n in range(100, 130)
    }
    assert len(spread) > 1


def test_a_subset_outside_the_pool_is_503_with_a_message(http: httpx2.Client) -> None:
    response = http.post("/completions", json=completion(stream=False), headers={SUBSET_HEADER: "10.255.0.1"})
    assert response.status_code == 503
    assert "subset" in http_error_text(response)
