"""The EPP reads the KV-cache gauge of either vLLM release, end to end (DESIGN.md §2, Probing).

vLLM renamed `vllm:gpu_cache_usage_perc` to `vllm:kv_cache_usage_perc` in 0.10; a simulator of each
release publishes only its own name, and the EPP (default flags: the new name, falling back to the
old one) must read both pods' KV usage through real scrapes, and route on it.
"""

from __future__ import annotations

from harness.beds.testbed import TestBed
from harness.sim import SimConfig
from harness.sim._config import DEFAULT_VLLM_VERSION, OLD_VLLM_VERSION

OLD = SimConfig(model="base-model", time_scale=0.01, vllm_version=OLD_VLLM_VERSION)
NEW = SimConfig(model="base-model", time_scale=0.01, vllm_version=DEFAULT_VLLM_VERSION)


def test_kv_usage_of_old_and_new_vllm_releases_reaches_the_datastore(testbed: TestBed) -> None:
    testbed.start_epp()
    testbed.apply_pool()
    testbed.apply_model("chat", "base-model", criticality="Critical")
    testbed.add_pod("old", sim_config=OLD)
    testbed.add_pod("new", sim_config=NEW)
    testbed.eventually_consistent()
    assert "vllm:gpu_cache_usage_perc" in testbed.pods["old"].metrics_text()
    assert "vllm:kv_cache_usage_perc" not in testbed.pods["old"].metrics_text()

    testbed.set_gauges("old", kv_cache=0.61)
    testbed.set_gauges("new", kv_cache=0.23)
    testbed.eventually_gauges("old", kv_cache=0.61)
    testbed.eventually_gauges("new", kv_cache=0.23)
    # Equal queues, so the least-KV step decides: the scheduler used what it read.
    assert {testbed.routed_pod("base-model") for _ in range(10)} == {"new"}

    testbed.set_gauges("old", kv_cache=0.05)
    testbed.eventually_gauges("old", kv_cache=0.05)
    assert {testbed.routed_pod("base-model") for _ in range(10)} == {"old"}
