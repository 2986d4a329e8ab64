"""Errors of the Kubernetes client layer, so callers (the informer) can tell what to do next.

`GoneError` means "your resourceVersion is too old: relist"; `WatchStalledError` means "this
watch's connection is dead: watch again at once"; `KubeConnectionError` and other `ApiError`s mean
"back off and try again". Transport exceptions from aiohttp are translated here,
at the boundary, and chained with `from`.
"""

from __future__ import annotations


class KubeError(Exception):
    """Base of everything the k8s layer raises."""


class KubeConfigError(KubeError):
    """No usable kubeconfig / in-cluster configuration."""


class KubeConnectionError(KubeError):
    """The connection failed, timed out or was dropped mid-stream."""


class WatchStalledError(KubeConnectionError):
    """A watch read nothing (no event, no bookmark, no end) for longer than a live watch can stay
    silent: the connection is dead or half-open. Replace the watch; the server is not to blame."""


class ApiError(KubeError):
    """The API server answered with a failure status (HTTP status, or an ERROR watch event)."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}".strip(": "))
        self.status = status
        self.reason = reason
        self.message = message


class GoneError(ApiError):
    """410 Gone / Expired: the requested resourceVersion was compacted away; relist."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(410, reason, message)
