"""Our EPP through the shipped EPP-agnostic scenario of `harness.scenarios.conformance.test_target_ports`:
a pool's targetPorts shrink and grow (upstream #2306)."""

from harness.scenarios.conformance.test_target_ports import *  # noqa: F403
