"""Pod helpers shared by the node agent's tests (process runtime and container runtime)."""

from __future__ import annotations

from collections.abc import Callable

from harness.base.eventually import eventually
from harness.cluster.kube import JsonObject, Kube
from harness.cluster.pod_status import container_statuses


def wait_for(
    kube: Kube, namespace: str, name: str, check: Callable[[JsonObject], None], timeout: float
) -> JsonObject:
    """The pod as soon as `check` passes on it (polled through the API)."""

    def current() -> JsonObject:
        found = kube.pods.get(namespace, name)
        check(found)
        return found

    return eventually(current, timeout=timeout, message=f"pod {name}")


def the_container(found: JsonObject) -> JsonObject:
    """The status of the pod's one container."""
    statuses = container_statuses(found)
    assert len(statuses) == 1, f"container statuses so far: {statuses}"
    return statuses[0]
