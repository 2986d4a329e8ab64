"""Our EPP through the shipped EPP-agnostic scenarios of
`harness.scenarios.conformance.test_kubectl`:
models and pod labels changed with the real kubectl."""

from harness.scenarios.conformance.test_kubectl import *  # noqa: F403
