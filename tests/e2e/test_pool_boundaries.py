"""Our EPP through the shipped EPP-agnostic scenarios of `harness.scenarios.conformance.test_pool_boundaries`:
two pools in one namespace, an EPP each; same-named pools in two API groups (upstream #1275)."""

from harness.scenarios.conformance.test_pool_boundaries import *  # noqa: F403
