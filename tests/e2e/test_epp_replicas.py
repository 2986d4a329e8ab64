"""Our EPP through the shipped EPP-agnostic scenarios of `harness.scenarios.conformance.test_epp_replicas`:
leader failover under --ha-enable-leader-election, a replica drained with streams in flight (#548)."""

from harness.scenarios.conformance.test_epp_replicas import *  # noqa: F403
