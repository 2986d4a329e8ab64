"""LoRA affinity as the simulators see it: requests for an adapter concentrate on the pod running it.

What the scheduler promises (soft affinity): while queues are low, a request for an adapter goes to a
pod that reports the adapter running or waiting, and only with probability 1 - LORA_AFFINITY_THRESHOLD
to a pod that merely has a free adapter slot. The default 0.999 makes strays rare but not independent:
a stray loads the adapter on a second pod, which then rightly attracts the adapter's traffic too. So
this test runs the EPP with LORA_AFFINITY_THRESHOLD=1 (the upstream env knob) and expects every request
on the pod running the adapter; the 0.999 split itself is tested statistically in the unit tests.
The test makes one pod run the adapter for real (a streamed request kept open), waits until the EPP
has scraped that, and counts where the next requests for the adapter land.
"""

from __future__ import annotations

from collections import Counter

import openai
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, DEMO_ADAPTERS
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import (
    POD_PORT,
    cluster_of,
    endpoint,
    openai_client,
    requests_by_model,
    served_by,
)
from harness.sim import SimConfig

pytestmark = pytest.mark.e2e

MODEL = "sql-lora"
ADAPTER = "sql-lora-v1"
REQUESTS = 100
# The held request never finishes by itself (about 40 simulated minutes at time_scale 0.2) ...
HELD_MAX_TOKENS = 1_000_000
# ... and a KV cache big enough that holding it leaves room for everything else.
SIM = SimConfig(
    model=BASE_MODEL,
    lora_adapters=DEMO_ADAPTERS,
    max_loras=2,
    num_gpu_blocks=1_000_000,
    time_scale=0.2,
)


def send(client: openai.OpenAI) -> str:
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="select 1", max_tokens=1)
    return served_by(raw.headers)


def test_adapter_requests_concentrate_on_the_pod_running_it(stack_factory: StackFactory) -> None:
    # The filter tree's soft affinity (its LORA_AFFINITY_THRESHOLD knob); the default scorer
    # scheduler weighs affinity against load instead (tests/unit/scheduling/test_scorers.py).
    stack = stack_factory(
        pods=4, sim_config=SIM, epp_env={"LORA_AFFINITY_THRESHOLD": "1"}, epp_args=["--scheduler=filter-tree"]
    )
    cluster = cluster_of(stack)
    address_to_pod = {endpoint(stack, name): name for name in cluster.pods}

    with openai_client(stack) as client:
        held = client.completions.create(
            model=MODEL, prompt="a long job", max_tokens=HELD_MAX_TOKENS, stream=True
        )
        with held:
            next(iter(held))  # admitted and generating: the adapter is running on that pod
            runner = address_to_pod[served_by(held.response.headers)]

            def epp_sees_adapter_on_runner_only() -> None:
                pods = {p["name"]: p["metrics"] for p in stack.datastore_view()["pods"]}
                with_adapter = sorted(n for n, m in pods.items() if ADAPTER in m["activeModels"])
                assert with_adapter == [runner], f"EPP sees {ADAPTER} running on {with_adapter}"

            eventually(epp_sees_adapter_on_runner_only, message="the EPP scraped the running adapter")
            before = requests_by_model(stack)
            landed = Counter(address_to_pod[send(client)] for _ in range(REQUESTS))
            after = requests_by_model(stack)
            runner_state = cluster.pods[runner].sim(POD_PORT).state()

    assert landed == {runner: REQUESTS}, f"requests per pod: {dict(landed)}"
    # The simulators agree: the runner got them, as the adapter, with the adapter loaded.
    assert after[runner].get(ADAPTER, 0) - before[runner].get(ADAPTER, 0) == landed[runner]
    assert ADAPTER in runner_state.loaded_loras
    assert runner_state.running >= 1, "the held request still runs"
