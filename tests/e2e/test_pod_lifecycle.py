"""Our EPP through the shipped EPP-agnostic scenarios of
`harness.scenarios.conformance.test_pod_lifecycle`:
removed pods stop getting traffic; no ready pod is 503 until one is ready again."""

from harness.scenarios.conformance.test_pod_lifecycle import *  # noqa: F403
