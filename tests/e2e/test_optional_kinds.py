"""Our EPP through the shipped EPP-agnostic scenario of `harness.scenarios.conformance.test_optional_kinds`:
the optional kinds unreadable at start, then granted (upstream #1737, istio.io #17528)."""

from harness.scenarios.conformance.test_optional_kinds import *  # noqa: F403
