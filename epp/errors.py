"""The EPP's one error tree and its one mapping to what Envoy answers the client.

Lower layers raise these (or get translated into them at the handler boundary, chained with
`from`); `http_status` is the only place a failure becomes a status code. Codes follow DESIGN.md
(protocol doc and upstream #1082), not upstream's code: zero endpoints is 503, not 429.
"""

from __future__ import annotations

from typing import ClassVar


class EppError(Exception):
    """Base: a request the EPP cannot route. `message` is one readable line for the client."""

    http_status: ClassVar[int] = 500
    # The upstream error_code label of inference_model_request_error_total.
    metric_code: ClassVar[str] = "Internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(EppError):
    http_status = 400
    metric_code = "BadRequest"


class PayloadTooLarge(EppError):
    """The request body exceeds the EPP's limit (`--maxRequestBodyBytes`)."""

    http_status = 413
    metric_code = "PayloadTooLarge"


class ModelNotFound(EppError):
    http_status = 404
    metric_code = "BadConfiguration"


class ResourceExhausted(EppError):
    """Load shedding: a non-critical request found no pod with capacity."""

    http_status = 429
    metric_code = "InferencePoolResourceExhausted"


class NoEndpoints(EppError):
    """Pool unknown or no ready endpoint."""

    http_status = 503
    metric_code = "ServiceUnavailable"


class Internal(EppError):
    http_status = 500
    metric_code = "Internal"
