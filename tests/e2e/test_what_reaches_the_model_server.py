"""Our EPP through the shipped EPP-agnostic scenarios of
`harness.scenarios.conformance.test_what_reaches_the_model_server`:
one destination header and the resolved model reach the model server."""

from harness.scenarios.conformance.test_what_reaches_the_model_server import *  # noqa: F403
