"""Our EPP through the shipped EPP-agnostic scenarios of
`harness.scenarios.conformance.test_load_shedding`:
critical requests served and the rest shed with 429 under saturation."""

from harness.scenarios.conformance.test_load_shedding import *  # noqa: F403
