"""The EPP process dies: Envoy fails closed (5xx, nothing reaches a pod); it comes back: routing resumes."""

from __future__ import annotations

import openai
import pytest

from harness.base.eventually import eventually
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import (
    DESTINATION_HEADER,
    access_log_since,
    cluster_of,
    endpoint,
    error_text,
    openai_client,
    served_by,
    settled_access_log,
    total_requests,
)

pytestmark = pytest.mark.e2e

MODEL = "food-review"
REQUESTS_WHILE_DOWN = 5


def test_epp_killed_fails_closed_and_restarted_routes_again(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2)
    assert stack.epp is not None
    pods = {endpoint(stack, name) for name in cluster_of(stack).pods}
    served_before = total_requests(stack)
    log_start = len(settled_access_log(stack))

    stack.epp.kill()
    with openai_client(stack) as client:
        for _ in range(REQUESTS_WHILE_DOWN):
            # Fail closed even when the client names a pod itself.
            with pytest.raises(openai.InternalServerError):  # any 5xx
                client.completions.create(
                    model=MODEL,
                    prompt="hello",
                    max_tokens=1,
                    extra_headers={DESTINATION_HEADER: next(iter(pods))},
                )
        entries = access_log_since(stack, log_start)
        assert [e["upstream_host"] for e in entries] == [None] * REQUESTS_WHILE_DOWN, entries
        assert total_requests(stack) == served_before

        stack.epp.start()
        stack.epp.wait_serving()

        def routed() -> str:
            try:
                raw = client.completions.with_raw_response.create(model=MODEL, prompt="hi", max_tokens=1)
            except openai.APIStatusError as err:
                raise AssertionError(f"{err.status_code}: {error_text(err)}") from err
            return served_by(raw.headers)

        assert eventually(routed, message="routing resumes after the EPP restarts") in pods


def test_client_sees_a_readable_message_while_the_epp_is_down(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=0)
    assert stack.epp is not None
    stack.epp.kill()
    with openai_client(stack) as client, pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=1)

    assert caught.value.status_code == 502
    message = error_text(caught.value)
    assert "endpoint picker" in message, message
    assert "ext_proc" in message, "the message names the hop that failed"
