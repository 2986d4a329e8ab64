"""The endpoint that really served a request, as the proxy reports it on the response side.

The v1 destination is a list (the pick first, then fallbacks) and the proxy walks it: when the pick
refuses the connection, a fallback serves. The proxy says which one in the response's
``metadata_context``: namespace ``envoy.lb``, key ``x-gateway-destination-endpoint-served``, the
``ip:port`` it reached (the endpoint picker protocol's "Destination Endpoint Served"). Without it,
the EPP would go on counting the request in flight on a pod that never received it, and remember
its prompt's prefix there.
"""

from __future__ import annotations

from typing import Any

from epp.config import DEFAULT_DESTINATION_ENDPOINT_HINT_METADATA_NAMESPACE

SERVED_NAMESPACE = DEFAULT_DESTINATION_ENDPOINT_HINT_METADATA_NAMESPACE
SERVED_KEY = "x-gateway-destination-endpoint-served"


def served_endpoint(metadata: Any) -> str | None:
    """The served ``ip:port`` in a response message's metadata_context, if the proxy sent one."""
    namespace = metadata.filter_metadata.get(SERVED_NAMESPACE)
    if namespace is None or SERVED_KEY not in namespace.fields:
        return None
    value = namespace.fields[SERVED_KEY]
    if value.WhichOneof("kind") != "string_value":
        return None
    return value.string_value.strip() or None
