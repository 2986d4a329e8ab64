"""The k8s layer's errors as an operator reads them in a log line: `ApiError` says the HTTP status,
then the reason and the API server's message when there are any, with no dangling separators."""

from __future__ import annotations

import pytest

from epp.k8s.errors import ApiError, GoneError, KubeError


@pytest.mark.parametrize(
    ("error", "text"),
    [
        pytest.param(ApiError(500), "500", id="status-only"),
        pytest.param(ApiError(409, "Conflict"), "409 Conflict", id="status-and-reason"),
        pytest.param(
            ApiError(403, "Forbidden", 'leases is forbidden: User "epp" cannot get resource "leases"'),
            '403 Forbidden: leases is forbidden: User "epp" cannot get resource "leases"',
            id="status-reason-and-message",
        ),
        pytest.param(
            ApiError(422, "Invalid", "spec.replicas: must be at most MAX"),
            "422 Invalid: spec.replicas: must be at most MAX",
            id="message-kept-to-its-last-letter",
        ),
        pytest.param(
            GoneError("Expired", "too old resource version: 1 (2)"),
            "410 Expired: too old resource version: 1 (2)",
            id="gone",
        ),
    ],
)
def test_an_api_error_reads_as_status_reason_and_message(error: ApiError, text: str) -> None:
    assert str(error) == text
    assert isinstance(error, KubeError)


def test_an_api_error_keeps_what_the_server_said_and_nothing_it_did_not() -> None:
    """Callers branch on `status` and `reason` (409 Conflict, 410 Gone): an absent reason or message
    stays empty rather than being filled in."""
    error = ApiError(500)
    assert (error.status, error.reason, error.message) == (500, "", "")
    conflict = ApiError(409, "Conflict")
    assert (conflict.status, conflict.reason, conflict.message) == (409, "Conflict", "")
