"""Our EPP through the shipped EPP-agnostic scenarios of
`harness.scenarios.conformance.test_any_epp`:
A terminating pod, a pool change, /v1/models, a re-created pool, stale metrics, request errors."""

from harness.scenarios.conformance.test_any_epp import *  # noqa: F403
