"""Our EPP through the shipped EPP-agnostic scenarios of
`harness.scenarios.conformance.test_openai_api`:
the real OpenAI client through Envoy: targets, weighted split, a 2 MiB prompt, 404 and 400."""

from harness.scenarios.conformance.test_openai_api import *  # noqa: F403
