"""Upstream's two test plugins, as gateway conformance runs configure an EPP (epp.config.ConformanceHooks).

* `header-based-testing-filter`: a test steers a request to chosen endpoints with the request header
  `test-epp-endpoint-selection`, a comma list of `ip` (any port) or `ip:port` entries (IPv6 in
  brackets), the subset hint's own forms (`epp.handlers.subset`). A request without the header has no
  candidate, as upstream's filter returns none: a misconfigured test fails loudly instead of being
  routed by load.
* `destination-endpoint-served-verifier`: the response headers carry
  `x-conformance-test-served-endpoint`, the endpoint the proxy reported as the one that served
  (`epp.handlers.served`), or a `fail: ...` text saying what was missing, so a test reads back what
  the EPP was told (upstream's GatewayDestinationEndpointServed).

Off unless an EndpointPickerConfig names them; nothing here runs otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.handlers.served import SERVED_KEY, SERVED_NAMESPACE, served_endpoint
from epp.handlers.subset import Subset, parse_subset

ENDPOINT_SELECTION_HEADER = "test-epp-endpoint-selection"
SERVED_RESULT_HEADER = "x-conformance-test-served-endpoint"


def selected_endpoints(headers: Mapping[str, str]) -> Subset:
    """The endpoints a request's `test-epp-endpoint-selection` header names (none without it)."""
    return parse_subset(headers.get(ENDPOINT_SELECTION_HEADER, ""))


def served_result(metadata: Any | None) -> str:
    """What `x-conformance-test-served-endpoint` says for a response's metadata_context (or None)."""
    if metadata is None or SERVED_NAMESPACE not in metadata.filter_metadata:
        return f"fail: missing {SERVED_NAMESPACE} metadata"
    endpoint = served_endpoint(metadata)
    if endpoint is None:
        return f"fail: missing {SERVED_KEY} metadata"
    return endpoint


def served_result_reply(metadata: Any | None) -> bytes:
    """The response-headers reply that adds `x-conformance-test-served-endpoint`."""
    resp = pb.ProcessingResponse()
    header = resp.response_headers.response.header_mutation.set_headers.add().header
    header.key = SERVED_RESULT_HEADER
    header.raw_value = served_result(metadata).encode()
    return bytes(resp.SerializeToString())
