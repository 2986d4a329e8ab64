"""The OpenAI API through Envoy + EPP as a client sees it, on one shared Stack (these tests only read).

Clients are the `openai` SDK; raw HTTP (`httpx2`, the SDK's own transport) only for bodies the SDK
cannot send. The demo's models: `food-review` splits 70/30 over two LoRA adapters, `sql-lora` maps to
one adapter, the base model is served as itself.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from harness.beds.stack import BASE_MODEL, DEMO_ADAPTERS, Stack, StackOptions
from harness.cluster.releases import V1
from harness.plugin.core import namespace_name
from harness.scenarios.support import (
    access_log_since,
    assert_readable_error,
    cluster_of,
    endpoint,
    error_text,
    http_error_text,
    openai_client,
    requests_by_model,
    served_by,
    settled_access_log,
    total_requests,
)
from harness.sim import SimConfig

pytestmark = [pytest.mark.e2e, pytest.mark.epp_agnostic]

SPLIT_TARGETS = {"food-review-1": 0.7, "food-review-2": 0.3}
SPLIT_REQUESTS = 300
# Width of the acceptance band for the weighted split, in binomial standard deviations.
SPLIT_SIGMAS = 4.0
MAX_TOKENS = 3
TWO_MIB = 2 * 1024 * 1024
CHARS_PER_TOKEN = 4  # the simulator's token estimate


@pytest.fixture(scope="module")
def shared_stack_options(request: pytest.FixtureRequest) -> StackOptions:
    # A tiny time scale: the simulated prefill of a 2 MiB prompt (~105 s) takes ~0.1 s.
    sim = SimConfig(model=BASE_MODEL, lora_adapters=DEMO_ADAPTERS, max_loras=2, time_scale=0.001)
    return StackOptions(namespace=namespace_name(request.module.__name__), sim_config=sim)


def pod_endpoints(stack: Stack) -> set[str]:
    return {endpoint(stack, name) for name in cluster_of(stack).pods}


# ---------------------------------------------------------------------------------------- happy paths


def complete(client: openai.OpenAI, kind: str, stream: bool) -> tuple[Any, list[Any]]:
    """One request of ``kind`` for `food-review`; returns (raw response, parsed items)."""
    options: dict[str, Any] = {"model": "food-review", "max_tokens": MAX_TOKENS}
    if stream:
        options |= {"stream": True, "stream_options": {"include_usage": True}}
    if kind == "completion":
        raw = client.completions.with_raw_response.create(prompt="Say something about food", **options)
    else:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something about food"}]
        raw = client.chat.completions.with_raw_response.create(messages=messages, **options)
    parsed = raw.parse()
    return raw, list(parsed) if stream else [parsed]


def text_of(kind: str, item: Any) -> str:
    choice = item.choices[0]
    if kind == "completion":
        return str(choice.text)
    content = choice.delta.content if hasattr(choice, "delta") else choice.message.content
    return str(content or "")


@pytest.mark.parametrize(
    ("kind", "stream"),
    [
        pytest.param("completion", False, id="completion"),
        pytest.param("completion", True, id="completion-streamed"),
        pytest.param("chat", False, id="chat"),
        pytest.param("chat", True, id="chat-streamed"),
    ],
)
@pytest.mark.needs("model-aware-routing")
def test_request_is_served_by_a_pool_pod_as_a_target_model(
    shared_stack: Stack, kind: str, stream: bool
) -> None:
    with openai_client(shared_stack) as client:
        raw, items = complete(client, kind, stream)

    assert raw.status_code == 200
    assert served_by(raw.headers) in pod_endpoints(shared_stack)
    assert {item.model for item in items} <= set(SPLIT_TARGETS), "the body's model was rewritten"
    if stream:
        *content, usage_chunk = items
        assert usage_chunk.choices == [], "include_usage ends the stream with a usage-only chunk"
        assert all(chunk.usage is None for chunk in content)
        assert content[-1].choices[0].finish_reason == "length"
    else:
        content, usage_chunk = items, items[0]
        assert items[0].choices[0].finish_reason == "length"
    assert "".join(text_of(kind, item) for item in content).strip()
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == MAX_TOKENS


@pytest.mark.needs("model-aware-routing")
def test_weighted_split_across_two_target_models(shared_stack: Stack) -> None:
    before = requests_by_model(shared_stack)
    with openai_client(shared_stack) as client:
        answered = Counter(
            client.completions.create(model="food-review", prompt="rate this dish", max_tokens=1).model
            for _ in range(SPLIT_REQUESTS)
        )
    after = requests_by_model(shared_stack)

    assert set(answered) <= set(SPLIT_TARGETS)
    for target, share in SPLIT_TARGETS.items():
        mean = SPLIT_REQUESTS * share
        band = SPLIT_SIGMAS * math.sqrt(SPLIT_REQUESTS * share * (1 - share))
        assert mean - band <= answered[target] <= mean + band, (
            f"{target}: {answered[target]}/{SPLIT_REQUESTS}, expected {mean:.0f} ± {band:.0f}"
        )
        # The simulators saw the same split: the rewritten model name reached them.
        seen = sum(after[pod].get(target, 0) - before[pod].get(target, 0) for pod in after)
        assert seen == answered[target]


@pytest.mark.parametrize(
    ("model", "target"),
    [
        pytest.param(BASE_MODEL, BASE_MODEL, id="body-passed-through"),
        pytest.param(
            "sql-lora",
            "sql-lora-v1",
            id="body-rewritten-for-target",
            marks=pytest.mark.needs("model-aware-routing"),
        ),
    ],
)
def test_two_mib_prompt_is_routed(shared_stack: Stack, model: str, target: str) -> None:
    prompt = "x" * TWO_MIB
    with openai_client(shared_stack) as client:
        raw = client.completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=1)
    completion = raw.parse()

    assert served_by(raw.headers) in pod_endpoints(shared_stack)
    assert completion.model == target
    assert completion.usage is not None
    # The simulator counted every character: the whole prompt arrived.
    assert completion.usage.prompt_tokens == TWO_MIB // CHARS_PER_TOKEN


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.departure("readable-error-bodies")
@pytest.mark.needs("model-aware-routing")
def test_unknown_model_is_404_with_a_message(shared_stack: Stack) -> None:
    served_before = total_requests(shared_stack)
    log_start = len(settled_access_log(shared_stack))
    with openai_client(shared_stack) as client, pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no-such-model", prompt="hello", max_tokens=1)

    assert caught.value.status_code == 404
    [entry] = access_log_since(shared_stack, log_start)
    if cluster_of(shared_stack).generation is V1:  # undeclared models pass through: a pod says 404
        assert "no-such-model" in error_text(caught.value)
        assert entry["upstream_host"] is not None, "a v1 EPP routes an undeclared model as named"
        return
    assert_readable_error(caught.value, "model no-such-model not found")
    assert entry["upstream_host"] is None, "answered by the EPP, never sent to a pod"
    assert total_requests(shared_stack) == served_before


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b'{"model": "food-review", "prompt":', "invalid JSON request body", id="truncated-json"),
        pytest.param(
            b'{"model": "food-review", "prompt": "hi", "temperature": NaN}',
            "NaN is not valid JSON",
            id="nan-is-not-json",
        ),
        pytest.param(b'["food-review"]', "expected an object, got list", id="json-array"),
        pytest.param(b'{"prompt": "hello"}', 'missing or non-string "model"', id="no-model-field"),
    ],
)
@pytest.mark.departure("readable-error-bodies")
@pytest.mark.needs("request-validation")
def test_malformed_body_is_400_with_a_message(shared_stack: Stack, body: bytes, message: str) -> None:
    served_before = total_requests(shared_stack)
    # Raw HTTP: the SDK only sends well-formed bodies.
    with httpx2.Client(base_url=shared_stack.base_url, timeout=30) as http:
        response = http.post("/completions", content=body, headers={"content-type": "application/json"})

    assert response.status_code == 400
    assert message in http_error_text(response)
    assert total_requests(shared_stack) == served_before
