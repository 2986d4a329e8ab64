"""Our EPP through the shipped gateway scenarios of `harness.scenarios.conformance.test_gateway`:
FailOpen / FailClose with the EPP down, data-parallel ranks, two pools split by weight."""

from harness.scenarios.conformance.test_gateway import *  # noqa: F403
