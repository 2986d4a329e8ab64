"""Reading a pod's status as the API server returns it (plain JSON): readiness and container states.

Here rather than beside the test's cluster so that every part that reads pods (the chart install,
the beds, tests) shares one reading of the Ready condition.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.cluster.kube import JsonObject


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def container_statuses(pod: Mapping[str, Any]) -> list[JsonObject]:
    return list((pod.get("status") or {}).get("containerStatuses") or [])
