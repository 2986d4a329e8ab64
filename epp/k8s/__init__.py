"""The EPP's own small Kubernetes layer: REST client, informers, work queues, controllers.

Asyncio on aiohttp, read-only (list + watch). The `kubernetes` package is for the harness only.
"""

from epp.k8s.client import PODS, KubeClient, Resource, WatchEvent
from epp.k8s.config import KubeConfig, load_config, load_incluster_config, load_kubeconfig
from epp.k8s.controllers import Controllers
from epp.k8s.errors import (
    ApiError,
    GoneError,
    KubeConfigError,
    KubeConnectionError,
    KubeError,
    WatchStalledError,
)

__all__ = [
    "PODS",
    "ApiError",
    "Controllers",
    "GoneError",
    "KubeClient",
    "KubeConfig",
    "KubeConfigError",
    "KubeConnectionError",
    "KubeError",
    "Resource",
    "WatchEvent",
    "WatchStalledError",
    "load_config",
    "load_incluster_config",
    "load_kubeconfig",
]
