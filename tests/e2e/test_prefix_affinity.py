"""Prefix affinity as a user sees it: a conversation's follow-ups land on the pod that served its start.

The EPP runs upstream's default profile as we ship it (``examples/config/upstream-default.yaml``:
queue 2, KV cache 2, prefix 3, highest total wins), which is what an upstream user brings. One
request at a time keeps every queue empty and the KV caches nearly so, which leaves the prefix
score to decide: the first request of each conversation may go anywhere, every follow-up (the same
long history, a new question) must go where that history was sent. The model servers agree: the pod
that served the start answers the follow-ups from its prefix cache, and no other pod's prefix cache
ever hits, so the prefix credit went to the pod that really holds the prefix.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.base.shipped import shipped_path
from harness.beds.stack import BASE_MODEL
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import POD_PORT, cluster_of, endpoint, openai_client, served_by
from harness.sim import SimConfig

pytestmark = pytest.mark.e2e

PROFILE = "examples/config/upstream-default.yaml"
CONVERSATIONS = 6
FOLLOW_UPS = 5
# Histories far longer than a question (about 190 blocks of 16 tokens each), different from the
# first character on, so two conversations never share a block.
HISTORY_WORDS = 3000
SIM = SimConfig(model=BASE_MODEL, num_gpu_blocks=1_000_000, time_scale=0.05)


def history(conversation: int) -> str:
    return " ".join(f"c{conversation}w{word}" for word in range(HISTORY_WORDS))


def prefix_cache_hits(base_url: str) -> float:
    """The model server's ``vllm:prefix_cache_hits`` counter (prompt tokens served from its cache)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:prefix_cache_hits":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError(f"{base_url}/metrics has no vllm:prefix_cache_hits counter")


def test_follow_ups_land_on_the_pod_holding_their_history_and_hit_its_prefix_cache(
    stack_factory: StackFactory,
) -> None:
    stack = stack_factory(pods=4, sim_config=SIM, epp_args=["--config-file", str(shipped_path(PROFILE))])
    cluster = cluster_of(stack)
    pod_of_address = {endpoint(stack, name): name for name in cluster.pods}
    metrics_url = {name: f"http://{pod.ip}:{POD_PORT}" for name, pod in cluster.pods.items()}

    def send(client: openai.OpenAI, prompt: str) -> str:
        raw = client.completions.with_raw_response.create(model=BASE_MODEL, prompt=prompt, max_tokens=1)
        return pod_of_address[served_by(raw.headers)]

    with openai_client(stack) as client:
        started_on = {c: send(client, history(c) + " first question?") for c in range(CONVERSATIONS)}
        hits_before = {name: prefix_cache_hits(url) for name, url in metrics_url.items()}
        landed: dict[int, list[str]] = defaultdict(list)
        for turn in range(FOLLOW_UPS):
            for c in range(CONVERSATIONS):
                landed[c].append(send(client, f"{history(c)} follow-up {turn}?"))
        hits_after = {name: prefix_cache_hits(url) for name, url in metrics_url.items()}

    strays = {c: pods for c, pods in landed.items() if set(pods) != {started_on[c]}}
    assert not strays, f"follow-ups away from their history's pod: {strays} (starts: {started_on})"
    # The model servers agree: only the pods that hold a history hit their prefix caches, each for
    # at least the full history blocks of every follow-up it served.
    holders = set(started_on.values())
    for name in cluster.pods:
        gained = hits_after[name] - hits_before[name]
        served = sum(pods.count(name) for pods in landed.values())
        if name in holders:
            assert gained >= served * 100 * 16, f"{name}: {gained} tokens hit for {served} follow-ups"
        else:
            assert gained == 0, f"{name} holds no history yet its prefix cache hit {gained} tokens"
