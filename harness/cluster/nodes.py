"""Node objects that the real scheduler and node-lifecycle controller accept as live kubelets.

``NodeSet`` registers N Nodes the way a kubelet does (status included: Ready, capacity and
allocatable, addresses, node info) and then keeps one ``coordination.k8s.io`` Lease per node renewed
in ``kube-node-lease``, as a kubelet's heartbeat does (every 10 s for a 40 s lease), so the
node-lifecycle controller never marks them NotReady and taints them ``NoExecute``. Nothing runs pods
on these nodes: the scheduler binds pods to them (``spec.nodeName``), and that is all. The node
agent (``harness.nodeagent``), which also runs the bound pods, builds on this class.

Isolation in a shared control plane: Nodes are cluster-scoped and the scheduler binds *any* pending
pod to *any* schedulable node. So every set labels its nodes ``epp-harness/node-set=<id>`` and (by
default) taints them ``epp-harness/node-set=<id>:NoSchedule``; only pods that tolerate the taint and
select the label (``pod_spec_fields()``) land there, and nobody else's pod does.

    with NodeSet(api_client, count=2) as nodes:
        deployment["spec"]["template"]["spec"].update(nodes.pod_spec_fields())
        ...
    # leases stopped, Nodes (and, through owner references, their Leases) deleted

The renewals run on one thread owned by the set (named ``node-leases-<id>``), stopped and joined by
``stop()``; renewal errors are kept (``renewal_errors``) rather than killing the thread, because a
missed renewal is what a real kubelet would survive too.
"""

from __future__ import annotations

import functools
import secrets
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Self

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.base.eventually import eventually
from harness.base.lifecycle import StartStop
from harness.cluster.kube import JsonObject, response_json

NODE_SET_KEY: Final = "epp-harness/node-set"
LEASE_NAMESPACE: Final = "kube-node-lease"
LEASE_DURATION_S: Final = 40  # the kubelet's default nodeLeaseDurationSeconds
RENEW_INTERVAL_S: Final = 10.0  # the kubelet renews at a quarter of the duration
DEFAULT_CAPACITY: Final = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
KUBELET_VERSION: Final = "v1.36.3"


class NodeSet(StartStop):
    """``count`` Nodes with renewed Leases, labelled (and tainted) with a set-unique id."""

    def __init__(
        self,
        api_client: client.ApiClient,
        count: int = 1,
        *,
        taint: bool = True,
        labels: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        renew_interval: float = RENEW_INTERVAL_S,
        wait_schedulable: bool = True,
        timeout: float = 60.0,
        internal_ip: str | None = None,
    ) -> None:
        """``wait_schedulable``: ``start()`` returns once the node-lifecycle controller has lifted the
        ``node.kubernetes.io/not-ready`` taint that admission puts on every new Node (as for a real
        kubelet's node); pass False in a plane without controllers, where it is never lifted.
        ``internal_ip``: the nodes' InternalIP address (a pod's ``hostIP``); only a Hostname otherwise."""
        # A letter first: an all-hex id such as 1e234567 reads as a number in YAML 1.2 (kubectl's).
        self.id = "n" + secrets.token_hex(4)
        self.names = [f"harness-node-{self.id}-{i}" for i in range(count)]
        self.labels = {**(labels or {}), NODE_SET_KEY: self.id}
        self.taint = {"key": NODE_SET_KEY, "value": self.id, "effect": "NoSchedule"} if taint else None
        self.capacity = dict(capacity or DEFAULT_CAPACITY)
        self.internal_ip = internal_ip
        self.renewal_errors: list[str] = []
        self._core = client.CoreV1Api(api_client)
        self._leases = client.CustomObjectsApi(api_client)  # raw JSON for coordination.k8s.io/v1
        self._renew_interval = renew_interval
        self._wait_schedulable = wait_schedulable
        self._timeout = timeout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._registered: list[str] = []

    # ------------------------------------------------------------------ what pods need to land here

    def pod_spec_fields(self) -> JsonObject:
        """``nodeSelector`` (and ``tolerations`` when tainted) for a pod (template) spec."""
        fields: JsonObject = {"nodeSelector": {NODE_SET_KEY: self.id}}
        if self.taint is not None:
            fields["tolerations"] = [{**self.taint, "operator": "Equal"}]
        return fields

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Register every node and its lease, then start renewing; on failure undo what was done."""
        if self._thread is not None:
            raise RuntimeError("node set already started")
        try:
            for name in self.names:
                node = response_json(
                    self._core.create_node(
                        client.V1Node.model_validate(self._node(name)), _preload_content=False
                    )
                )
                self._registered.append(name)
                self._create_lease(name, str(node["metadata"]["uid"]))
        except BaseException:
            self._delete_nodes()
            raise
        self._thread = threading.Thread(target=self._renew_loop, name=f"node-leases-{self.id}", daemon=True)
        self._thread.start()
        if self._wait_schedulable:
            try:
                eventually(self._assert_schedulable, timeout=self._timeout, message="nodes schedulable")
            except BaseException:
                self.stop()
                raise
        return self

    def _assert_schedulable(self) -> None:
        for name in self.names:
            node = response_json(self._core.read_node(name, _preload_content=False))
            others = [t["key"] for t in node["spec"].get("taints") or [] if t["key"] != NODE_SET_KEY]
            assert not others, f"{name} is still tainted {others} (is the node-lifecycle controller running?)"

    def stop(self) -> None:
        """Stop renewing (joins the thread), then delete the Nodes and their Leases. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._delete_nodes()

    # ------------------------------------------------------------------ the kubelet's part

    def _node(self, name: str) -> JsonObject:
        now = _time()
        conditions = [
            _condition("MemoryPressure", "False", "KubeletHasSufficientMemory", now),
            _condition("DiskPressure", "False", "KubeletHasNoDiskPressure", now),
            _condition("PIDPressure", "False", "KubeletHasSufficientPID", now),
            _condition("Ready", "True", "KubeletReady", now),
        ]
        spec: JsonObject = {"taints": [self.taint]} if self.taint is not None else {}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {**self.labels, "kubernetes.io/hostname": name}},
            "spec": spec,
            "status": {  # a kubelet registers with its status; the API keeps it on create
                "capacity": self.capacity,
                "allocatable": self.capacity,
                "conditions": conditions,
                "addresses": [
                    *([{"type": "InternalIP", "address": self.internal_ip}] if self.internal_ip else []),
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": "",
                    "containerRuntimeVersion": "harness://0",
                    "kernelVersion": "",
                    "kubeProxyVersion": "",
                    "kubeletVersion": KUBELET_VERSION,
                    "machineID": "",
                    "operatingSystem": "linux",
                    "osImage": "inference-epp harness",
                    "systemUUID": "",
                },
            },
        }

    def _create_lease(self, name: str, node_uid: str) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": LEASE_NAMESPACE,
                # as the kubelet does: deleting the Node lets the garbage collector delete the Lease
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}],
            },
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": LEASE_DURATION_S,
                "renewTime": _micro_time(),
            },
        }
        response_json(
            self._leases.create_namespaced_custom_object(
                "coordination.k8s.io", "v1", LEASE_NAMESPACE, "leases", body, _preload_content=False
            )
        )

    def renew(self) -> None:
        """Renew every lease now (the thread does this every ``renew_interval`` seconds)."""
        for name in self.names:
            patch = {"spec": {"renewTime": _micro_time(), "holderIdentity": name}}
            reply = self._leases.patch_namespaced_custom_object(
                "coordination.k8s.io", "v1", LEASE_NAMESPACE, "leases", name, patch,
                _content_type="application/merge-patch+json", _preload_content=False,
            )  # fmt: skip
            response_json(reply)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._renew_interval):
            try:
                self.renew()
            except Exception as exc:  # a missed heartbeat is survivable; the next one may succeed
                self.renewal_errors.append(f"{datetime.now(UTC).isoformat()}: {exc!r}")

    def _delete_nodes(self) -> None:
        """Nodes and Leases both (the garbage collector would delete the Leases, but a minimal plane
        has none)."""
        for name in list(self._registered):
            _ignore_not_found(functools.partial(self._core.delete_node, name, _preload_content=False))
            delete_lease = functools.partial(
                self._leases.delete_namespaced_custom_object, "coordination.k8s.io", "v1", LEASE_NAMESPACE
            )
            _ignore_not_found(functools.partial(delete_lease, "leases", name, _preload_content=False))
            self._registered.remove(name)


def _ignore_not_found(request: Callable[[], Any]) -> None:
    """Send a raw request and read its reply; a 404 is fine (already gone)."""
    try:
        request().read()
    except ApiException as exc:
        if exc.status != 404:
            raise


def _condition(kind: str, status: str, reason: str, now: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": reason,
            "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip


def _time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_time() -> str:
    """``metav1.MicroTime`` text, the format of a Lease's ``renewTime``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
