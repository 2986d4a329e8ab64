"""The body limit is one number for Envoy and the EPP, and a body over it gets a readable 413 before
any model server sees it; a rewrite that grows the body past it is refused, not half-applied.

Our EPP only (the limit's message and the rewrite's accounting are ours), on the Stack of the
EPP-agnostic scenario module `harness.scenarios.conformance.test_what_reaches_the_model_server`.
"""

from __future__ import annotations

import json

import pytest

from harness.beds.stack import Stack
from harness.scenarios.conformance.test_what_reaches_the_model_server import (
    BODY_LIMIT,
    received_by,
    send,
    shared_stack_options,
    stack,
)
from harness.scenarios.support import http_error_text, total_requests

pytestmark = pytest.mark.e2e
__all__ = ["shared_stack_options", "stack"]  # the module's fixtures, shared with the scenario module


def test_a_body_over_the_limit_is_413_before_any_model_server(stack: Stack) -> None:
    served_before = total_requests(stack)
    too_big = json.dumps({"model": "food-review", "prompt": "x" * BODY_LIMIT}).encode()
    response = send(stack, "/completions", too_big, [])
    assert response.status_code == 413
    assert http_error_text(response) == f"request body larger than the gateway's limit of {BODY_LIMIT} bytes"
    assert total_requests(stack) == served_before


@pytest.mark.parametrize(("rewritten_size", "status"), [(BODY_LIMIT, 200), (BODY_LIMIT + 1, 413)])
def test_the_limit_applies_to_the_body_the_model_server_would_get(
    stack: Stack, rewritten_size: int, status: int
) -> None:
    """One number for Envoy and the EPP, and it bounds what is forwarded: a rewrite that grows the
    body past it (food-review → food-review-1 adds 2 bytes) is refused, not half-applied."""
    growth = len("food-review-1") - len("food-review")
    envelope = len(json.dumps({"model": "food-review", "prompt": "", "max_tokens": 1}).encode())
    prompt = "x" * (rewritten_size - growth - envelope)
    body = json.dumps({"model": "food-review", "prompt": prompt, "max_tokens": 1}).encode()
    assert len(body) + growth == rewritten_size
    response = send(stack, "/completions", body, [])
    assert response.status_code == status, response.text
    if status == 200:
        _, received = received_by(stack, response, "/v1/completions")
        assert len(received.body) == rewritten_size
