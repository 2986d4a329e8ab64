"""Forged pod status: what no kubelet writes, kept for reproducing bugs that need it.

The cluster's pods are run by the node agent (``harness.nodeagent``), which writes status as a
kubelet does. Some bugs need states a kubelet never produces, or needs them at an exact moment: an
address changed in place on a running pod, status written directly without a process behind it, a
deletion held by a finalizer at a chosen moment. ``ForgedKubelet`` writes those. It works only on
pods the agent never runs: pods built by ``PodBuilder`` carry ``spec.schedulerName:
epp-harness-kubelet-stand-in`` (``harness.cluster.builders.STAND_IN_SCHEDULER``), which no scheduler
serves, so they are never bound to a node and no kubelet (the agent included) ever touches them.

Pods are created through the API (``ForgedKubelet.start`` or ``Kube.pods.create``); this class then
writes their status through the ``status`` subresource only (podIP/podIPs, phase Running,
Ready/ContainersReady conditions with ``lastTransitionTime``), flips readiness, changes IPs, and
deletes a pod while a finalizer holds it, so a watcher sees the deletionTimestamp before the object
goes away:

    forged = ForgedKubelet(api_client)
    forged.start(ns, PodBuilder("p1").labels(app="x").build(), ip="127.0.0.5")
    forged.make_unready(ns, "p1")
    forged.change_ip(ns, "p1", "127.0.0.6")
    with forged.deleting(ns, "p1"):      # deletionTimestamp set, object still there
        ...
    # released: the pod is gone

Status writes are read-modify-write JSON merge patches carrying the resourceVersion read, retried
on conflict; ``status.conditions`` is always written as a whole list (merge patch replaces lists).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.cluster.builders import HOLD_FINALIZER, SIM_CONTAINER, SIM_IMAGE, rfc3339
from harness.cluster.kube import JsonObject, Kube, WriteObserver

_CONFLICT_RETRIES: Final = 10


class ForgedKubelet:
    """Writes status no kubelet would for stand-in pods (never bound): forges readiness, IPs, deletion."""

    def __init__(
        self,
        api_client: client.ApiClient,
        clock: Callable[[], datetime] | None = None,
        *,
        on_write: WriteObserver | None = None,
    ) -> None:
        """`on_write` is told of every write this makes (as `harness.cluster.kube.Kube` tells it)."""
        self._kube = Kube(api_client, on_write=on_write)
        self._clock = clock or (lambda: datetime.now(UTC))

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, namespace: str, pod: JsonObject, ip: str, ready: bool = True) -> JsonObject:
        """Create the pod through the API and report it Running at ``ip`` (Ready unless told)."""
        created = self._kube.pods.create(namespace, pod)
        name = str(created["metadata"]["name"])
        return (
            self.make_ready(namespace, name, ip) if ready else self._set_running(namespace, name, ip, False)
        )

    def make_ready(self, namespace: str, name: str, ip: str) -> JsonObject:
        """Phase Running, ``podIP``/``podIPs`` = ``ip``, Ready and ContainersReady True."""
        return self._set_running(namespace, name, ip, ready=True)

    def make_unready(self, namespace: str, name: str) -> JsonObject:
        """Ready and ContainersReady False; the IP (if any) and phase are kept."""
        return self._set_running(namespace, name, None, ready=False)

    def change_ip(self, namespace: str, name: str, new_ip: str) -> JsonObject:
        """Report a new ``podIP``/``podIPs``; readiness is kept as it is."""

        def change(pod: JsonObject) -> JsonObject:
            return {"status": {"podIP": new_ip, "podIPs": [{"ip": new_ip}]}}

        return self._update_status(namespace, name, change)

    def hold(self, namespace: str, name: str) -> JsonObject:
        """Add ``HOLD_FINALIZER`` so a later delete leaves the pod visible with a deletionTimestamp."""

        def add(pod: JsonObject) -> JsonObject | None:
            finalizers = list(pod["metadata"].get("finalizers") or [])
            if HOLD_FINALIZER in finalizers:
                return None
            return {"metadata": {"finalizers": [*finalizers, HOLD_FINALIZER]}}

        return self._update_metadata(namespace, name, add)

    def finalize_and_delete(self, namespace: str, name: str) -> JsonObject:
        """Hold the pod with a finalizer, then delete it; returns the pod with its deletionTimestamp.

        The pod stays (terminating) until ``release``. Pods here are never bound to a node, so
        without the finalizer the server would remove them at once.
        """
        self.hold(namespace, name)
        deleted = self._kube.pods.delete(namespace, name)
        if "deletionTimestamp" not in deleted.get("metadata", {}):
            deleted = self._kube.pods.get(namespace, name)
        return deleted

    def release(self, namespace: str, name: str) -> None:
        """Remove ``HOLD_FINALIZER``; a pod that is being deleted then disappears. Idempotent."""

        def remove(pod: JsonObject) -> JsonObject | None:
            finalizers = list(pod["metadata"].get("finalizers") or [])
            if HOLD_FINALIZER not in finalizers:
                return None
            return {"metadata": {"finalizers": [f for f in finalizers if f != HOLD_FINALIZER]}}

        try:
            self._update_metadata(namespace, name, remove)
        except ApiException as exc:
            if exc.status != 404:
                raise

    @contextmanager
    def deleting(self, namespace: str, name: str) -> Iterator[JsonObject]:
        """``finalize_and_delete`` on entry (yields the terminating pod), ``release`` on exit."""
        pod = self.finalize_and_delete(namespace, name)
        try:
            yield pod
        finally:
            self.release(namespace, name)

    def delete(self, namespace: str, name: str) -> None:
        """Delete the pod outright (it is gone at once unless a finalizer holds it)."""
        self._kube.pods.delete(namespace, name)

    # -- internals ---------------------------------------------------------------------------

    def _set_running(self, namespace: str, name: str, ip: str | None, ready: bool) -> JsonObject:
        def running(pod: JsonObject) -> JsonObject:
            now = self._clock()
            status: JsonObject = pod.get("status") or {}
            patch: JsonObject = {
                "phase": "Running",
                "conditions": _conditions(status.get("conditions") or [], ready, now, _container_names(pod)),
                "containerStatuses": _container_statuses(pod, status, ready, now),
            }
            if "startTime" not in status:
                patch["startTime"] = rfc3339(now)
            if ip is not None:
                patch["podIP"] = ip
                patch["podIPs"] = [{"ip": ip}]
            return {"status": patch}

        return self._update_status(namespace, name, running)

    def _update_status(
        self, namespace: str, name: str, change: Callable[[JsonObject], JsonObject]
    ) -> JsonObject:
        return self._read_modify_write(
            namespace, name, change, lambda patch: self._kube.pods.patch_status(namespace, name, patch)
        )

    def _update_metadata(
        self, namespace: str, name: str, change: Callable[[JsonObject], JsonObject | None]
    ) -> JsonObject:
        return self._read_modify_write(
            namespace, name, change, lambda patch: self._kube.pods.patch(namespace, name, patch)
        )

    def _read_modify_write(
        self,
        namespace: str,
        name: str,
        change: Callable[[JsonObject], JsonObject | None],
        apply: Callable[[JsonObject], JsonObject],
    ) -> JsonObject:
        """Read the pod, compute a merge patch, send it with the resourceVersion read; retry on 409."""
        last: ApiException | None = None  # the latest 409, chained into the final error
        for _ in range(_CONFLICT_RETRIES):
            current = self._kube.pods.get(namespace, name)
            patch = change(current)
            if patch is None:
                return current
            metadata = patch.setdefault("metadata", {})
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
            try:
                return apply(patch)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                last = exc
        raise RuntimeError(
            f"pod {namespace}/{name}: still conflicting after {_CONFLICT_RETRIES} attempts"
        ) from last


def _conditions(
    existing: list[JsonObject], ready: bool, now: datetime, containers: list[str]
) -> list[JsonObject]:
    """The whole new conditions list: kubelet-owned conditions set, others kept as they were.

    ``lastTransitionTime`` changes only for a condition whose status changes.
    """
    wanted = {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True" if ready else "False",
        "Ready": "True" if ready else "False",
    }
    by_type = {str(c.get("type")): c for c in existing}
    out: list[JsonObject] = [c for c in existing if c.get("type") not in wanted]
    for condition_type, status in wanted.items():
        old = by_type.get(condition_type)
        if old is not None and old.get("status") == status:
            out.append(old)
            continue
        condition: JsonObject = {"type": condition_type, "status": status, "lastTransitionTime": rfc3339(now)}
        if status == "False":
            condition["reason"] = "ContainersNotReady"
            condition["message"] = f"containers with unready status: [{' '.join(containers)}]"
        out.append(condition)
    return out


def _container_names(pod: JsonObject) -> list[str]:
    return [str(c.get("name", SIM_CONTAINER)) for c in pod.get("spec", {}).get("containers") or []]


def _container_statuses(pod: JsonObject, status: JsonObject, ready: bool, now: datetime) -> list[JsonObject]:
    previous = {str(s.get("name")): s for s in status.get("containerStatuses") or []}
    out: list[JsonObject] = []
    for container in pod.get("spec", {}).get("containers") or []:
        name = str(container.get("name", SIM_CONTAINER))
        old: dict[str, Any] = previous.get(name) or {}
        started_at = old.get("state", {}).get("running", {}).get("startedAt") or rfc3339(now)
        out.append(
            {
                "name": name,
                "image": str(container.get("image", SIM_IMAGE)),
                "imageID": "",
                "ready": ready,
                "started": True,
                "restartCount": int(old.get("restartCount", 0)),
                "state": {"running": {"startedAt": started_at}},
            }
        )
    return out
