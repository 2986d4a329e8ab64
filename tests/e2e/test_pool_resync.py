"""Our EPP through the shipped EPP-agnostic scenario of `harness.scenarios.conformance.test_pool_resync`:
a pool resync racing pod churn leaves every Ready pod routable (llm-d-router #2060)."""

from harness.scenarios.conformance.test_pool_resync import *  # noqa: F403
