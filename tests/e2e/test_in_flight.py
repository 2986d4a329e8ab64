"""The EPP's own in-flight count, through a real Envoy: a request counts on its pod from the moment
it is routed until its response has ended, and a client that disconnects stops counting too.

What this proves about Envoy (1.40, default processing mode: response headers SKIP, body NONE): it
keeps the ext_proc stream open while the response streams and ends it when the exchange is over, so
the EPP learns when a request finishes without any response phase sent to it.
"""

from __future__ import annotations

import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, DEMO_ADAPTERS, Stack
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import endpoint, openai_client, served_by
from harness.sim import SimConfig

pytestmark = pytest.mark.e2e

# Streams never end by themselves (a million tokens); short requests take ~0.1 s.
SIM = SimConfig(model=BASE_MODEL, lora_adapters=DEMO_ADAPTERS, max_loras=2, time_scale=0.05)
HELD_TOKENS = 1_000_000


def in_flight(stack: Stack) -> dict[str, int]:
    return {p["name"]: p["inFlight"] for p in stack.datastore_view()["pods"]}


def test_in_flight_counts_follow_the_response_and_the_client(stack_factory: StackFactory) -> None:
    stack = stack_factory(pods=2, sim_config=SIM, epp_args=["--scheduler=scorer"])
    pods = {endpoint(stack, name): name for name in ("vllm-pool-0", "vllm-pool-1")}
    assert in_flight(stack) == {"vllm-pool-0": 0, "vllm-pool-1": 0}

    with openai_client(stack) as client:
        held = client.completions.create(
            model=BASE_MODEL, prompt="a long story", max_tokens=HELD_TOKENS, stream=True
        )
        with held:
            next(iter(held))  # first token arrived: routed and streaming
            holder = pods[served_by(held.response.headers)]
            other = next(n for n in pods.values() if n != holder)

            def counted() -> None:
                assert in_flight(stack) == {holder: 1, other: 0}

            eventually(counted, message="the EPP counts the streaming request on its pod")

            # A short request finishes and stops counting, while the held one still counts.
            client.completions.create(model=BASE_MODEL, prompt="hi", max_tokens=4)
            eventually(counted, message="the finished request no longer counts")
        # Leaving the block closes the stream: the client disconnected mid-response.

        def released() -> None:
            assert in_flight(stack) == {holder: 0, other: 0}

        eventually(released, message="a disconnected client's request no longer counts")

        # The scorer steers away from a pod with a request in flight, between scrapes too.
        held = client.completions.create(
            model=BASE_MODEL, prompt="again", max_tokens=HELD_TOKENS, stream=True
        )
        with held:
            next(iter(held))
            first = pods[served_by(held.response.headers)]
            raw = client.completions.with_raw_response.create(model=BASE_MODEL, prompt="x", max_tokens=1)
            assert pods[served_by(raw.headers)] != first
