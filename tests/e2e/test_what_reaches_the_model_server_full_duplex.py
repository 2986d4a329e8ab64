"""The same checks as `test_what_reaches_the_model_server`, with Envoy streaming the request body to
the EPP in FULL_DUPLEX_STREAMED mode (DESIGN.md §2; the mode upstream v1.x deploys).

There the EPP answers the request headers only once the body has ended, and the Content-Length it
sets then is the one Envoy forwards (`allow_content_length_header`): a rewritten model name changes
the body's length, so the model server must get the length of the body as rewritten, not the one
the client declared. Same scenarios, same Stack shape; only Envoy's request body mode differs.
"""

from __future__ import annotations

import pytest

from harness.beds.stack import StackOptions
from harness.dataplane.envoy import EnvoyOptions
from harness.scenarios.conformance.test_what_reaches_the_model_server import *  # noqa: F403
from harness.scenarios.conformance.test_what_reaches_the_model_server import BODY_LIMIT, stack_options


@pytest.fixture(scope="module")
def shared_stack_options(request: pytest.FixtureRequest) -> StackOptions:
    return stack_options(
        request, EnvoyOptions(buffer_limit_bytes=BODY_LIMIT, request_body_mode="FULL_DUPLEX_STREAMED")
    )
