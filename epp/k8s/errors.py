"""Errors of the Kubernetes client layer, so callers (the informer) can tell what to do next.

`GoneError` means "your resourceVersion is too old: relist"; `KubeConnectionError` and other
`ApiError`s mean "back off and try again". Transport exceptions from aiohttp are translated here,
at the boundary, and chained with `from`.
"""

from __future__ import annotations


class KubeError(Exception):
    """Base of everything the k8s layer raises."""


class KubeConfigError(KubeError):
    """No usable kubeconfig / in-cluster configuration."""


class KubeConnectionError(KubeError):
    """The connection failed, timed out or was dropped mid-stream."""


class ApiError(KubeError):
    """The API server answered with a failure status (HTTP status, or an ERROR watch event)."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}".strip(": "))
        self.status = status
        self.reason = reason
        self.message = message


class GoneError(ApiError):
    """410 Gone / Expired: the requested resourceVersion was compacted away; relist."""

    def __init__(self, reason: str = "Expired", message: str = "") -> None:
        super().__init__(410, reason, message)
