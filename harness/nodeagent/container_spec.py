"""A pod's container spec as ``docker create`` flags: what a kubelet asks its container runtime for (pure).

The node agent's container runtime (``harness.nodeagent.containers``) runs our images as real
containers; this module decides *how*, from the pod and the image alone, so every rule is a table
test away:

* **securityContext** (the container's fields win over the pod's): ``runAsUser``/``runAsGroup`` →
  ``--user``; ``runAsNonRoot`` is checked against the user that will run (the image's ``USER`` when
  no ``runAsUser``) and refused as a kubelet refuses it (``container has runAsNonRoot and image will
  run as root``, or a non-numeric user it cannot verify); ``readOnlyRootFilesystem`` → ``--read-only``;
  ``allowPrivilegeEscalation: false`` → ``no-new-privileges``; ``capabilities`` → ``--cap-drop`` /
  ``--cap-add``; ``privileged``; ``seccompProfile`` ``RuntimeDefault`` (the engine's default profile)
  or ``Unconfined``; ``fsGroup`` and ``supplementalGroups`` → ``--group-add``.
* **resources** as the kubelet sets cgroups: ``limits.cpu`` → CFS quota over a 100 ms period
  (at least 1 ms), ``requests.cpu`` → CPU shares (milli-CPUs * 1024 / 1000, at least 2),
  ``limits.memory`` → the memory limit with no swap on top.
* **command and args** as Kubernetes defines them over an image: ``command`` replaces the
  ENTRYPOINT (and drops CMD), ``args`` replace CMD. ``address_args`` (what tells one of our programs
  its pod's address, since pods share the host's network here) go right before ``args``.
* **mounts**: what the runtime prepared for each ``volumeMount`` (a host directory, read-only or
  not, or an in-memory emptyDir as a tmpfs with its size limit).

Anything the agent cannot honour is a ``ContainerConfigError`` (``CreateContainerConfigError``),
never silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Final

from harness.nodeagent.images import ContainerConfigError

CFS_PERIOD_US: Final = 100_000
MIN_CFS_QUOTA_US: Final = 1_000
MIN_CPU_SHARES: Final = 2
_BINARY_SUFFIXES: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIXES: Final = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
}  # fmt: skip
_QUANTITY: Final = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_SECURITY_FIELDS: Final = frozenset(
    {"runAsUser", "runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem", "allowPrivilegeEscalation",
     "capabilities", "privileged", "seccompProfile"}
)  # fmt: skip
_POD_SECURITY_FIELDS: Final = frozenset(
    {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile", "fsGroup", "supplementalGroups",
     "fsGroupChangePolicy"}
)  # fmt: skip


def quantity(text: str | int | float) -> Decimal:
    """A Kubernetes resource quantity (``500m``, ``64Mi``, ``1.5``, ``2e3``) as a number."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ContainerConfigError(f"quantity {text!r} is not a Kubernetes quantity")
    number, suffix = match[1], match[2] or ""
    try:
        value = Decimal(number)
    except InvalidOperation as exc:
        raise ContainerConfigError(f"quantity {text!r} is not a Kubernetes quantity") from exc
    if suffix in _BINARY_SUFFIXES:
        return value * _BINARY_SUFFIXES[suffix]
    if suffix in _DECIMAL_SUFFIXES:
        return value * _DECIMAL_SUFFIXES[suffix]
    return value * Decimal(10) ** int(suffix[1:])


@dataclass(frozen=True)
class ImageConfig:
    """What the runtime needs of an image (``docker image inspect``)."""

    reference: str  # as the pod names it
    id: str  # sha256:...
    user: str  # the image's USER ("" is root)


@dataclass(frozen=True)
class Mount:
    """One ``volumeMount`` as the runtime prepared it: a host directory, or a tmpfs (``source`` None)."""

    target: str
    source: Path | None
    read_only: bool = False
    tmpfs_size: int | None = None  # bytes, for an in-memory emptyDir with a sizeLimit

    def flags(self) -> list[str]:
        if self.source is None:
            size = f",size={self.tmpfs_size}" if self.tmpfs_size else ""
            mode = "ro" if self.read_only else "rw"
            return ["--tmpfs", f"{self.target}:{mode},nosuid,nodev{size}"]
        suffix = ":ro" if self.read_only else ""
        return ["--volume", f"{self.source}:{self.target}{suffix}"]


def _security(pod: Mapping[str, Any], container: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod_context = dict((pod.get("spec") or {}).get("securityContext") or {})
    own = dict(container.get("securityContext") or {})
    unknown = (set(own) - _SECURITY_FIELDS) | (set(pod_context) - _POD_SECURITY_FIELDS)
    if unknown:
        raise ContainerConfigError(
            f"securityContext fields the harness node agent cannot honour: {', '.join(sorted(unknown))}"
        )
    merged = {k: pod_context[k] for k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")
              if k in pod_context}  # fmt: skip
    merged.update(own)
    return merged, pod_context


def _pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f'"{meta.get("name", "")}_{meta.get("namespace", "")}({meta.get("uid", "")})"'


def _image_uid(user: str) -> int | None:
    """The numeric uid of an image's USER ("" is root), None when it is a name."""
    name = user.partition(":")[0]
    if name in ("", "root"):
        return 0
    return int(name) if name.isdigit() else None


def security_flags(pod: Mapping[str, Any], container: Mapping[str, Any], image: ImageConfig) -> list[str]:
    """The pod's and the container's securityContext as ``docker create`` flags (see the module doc)."""
    context, pod_context = _security(pod, container)
    flags: list[str] = []
    user = context.get("runAsUser")
    group = context.get("runAsGroup")
    if user is not None or group is not None:
        as_user = str(user) if user is not None else image.user.partition(":")[0] or "0"
        flags += ["--user", f"{as_user}:{group}" if group is not None else as_user]
    if context.get("runAsNonRoot"):
        name = container.get("name") or ""
        if user is not None:
            if int(user) == 0:
                raise ContainerConfigError(
                    f"container's runAsUser breaks non-root policy (pod: {_pod_ref(pod)}, container: {name})"
                )
        else:
            uid = _image_uid(image.user)
            if uid is None:
                raise ContainerConfigError(
                    f"container has runAsNonRoot and image has non-numeric user ({image.user}), cannot "
                    f"verify user is non-root (pod: {_pod_ref(pod)}, container: {name})"
                )
            if uid == 0:
                raise ContainerConfigError(
                    f"container has runAsNonRoot and image will run as root (pod: {_pod_ref(pod)}, "
                    f"container: {name})"
                )
    groups = [pod_context["fsGroup"]] if pod_context.get("fsGroup") is not None else []
    groups += list(pod_context.get("supplementalGroups") or ())
    for extra in groups:
        flags += ["--group-add", str(int(extra))]
    if context.get("privileged"):
        flags.append("--privileged")
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if context.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    capabilities = context.get("capabilities") or {}
    for cap in capabilities.get("drop") or ():
        flags += ["--cap-drop", str(cap)]
    for cap in capabilities.get("add") or ():
        flags += ["--cap-add", str(cap)]
    seccomp = str((context.get("seccompProfile") or {}).get("type") or "RuntimeDefault")
    if seccomp == "Unconfined":
        flags += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        raise ContainerConfigError(f"seccompProfile {seccomp} is not supported by the harness node agent")
    return flags


def resource_flags(container: Mapping[str, Any]) -> list[str]:
    """``resources`` as the kubelet's cgroup settings (see the module doc)."""
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    flags: list[str] = []
    if "cpu" in limits:
        milli = quantity(limits["cpu"]) * 1000
        quota = max(MIN_CFS_QUOTA_US, int(milli * CFS_PERIOD_US / 1000))
        flags += ["--cpu-period", str(CFS_PERIOD_US), "--cpu-quota", str(quota)]
    cpu_request = requests.get("cpu", limits.get("cpu"))
    if cpu_request is not None:
        shares = max(MIN_CPU_SHARES, int(quantity(cpu_request) * 1000 * 1024 / 1000))
        flags += ["--cpu-shares", str(shares)]
    if "memory" in limits:
        memory = int(quantity(limits["memory"]))
        flags += ["--memory", str(memory), "--memory-swap", str(memory)]
    return flags


def command_line(
    container: Mapping[str, Any], address_args: Sequence[str] = ()
) -> tuple[str | None, tuple[str, ...]]:
    """``(entrypoint override or None, arguments after the image)``, Kubernetes' rules over the image's."""
    command = container.get("command") or []
    args = container.get("args") or []
    if not isinstance(command, list) or not isinstance(args, list):
        raise ContainerConfigError("command and args must be lists of strings")
    rest = (*address_args, *(str(a) for a in args))
    if command:
        return str(command[0]), (*(str(c) for c in command[1:]), *rest)
    return None, rest


def volume_of(pod: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        if volume.get("name") == name:
            return dict(volume)
    raise ContainerConfigError(f"volumeMount {name!r} names no volume of the pod")


def is_service_account_volume(volume: Mapping[str, Any]) -> bool:
    """The projected volume the ServiceAccount admission plugin adds (``kube-api-access-*``): a bound
    token, the ``kube-root-ca.crt`` CA and the namespace."""
    sources = (volume.get("projected") or {}).get("sources")
    if not sources:
        return False
    kinds = set()
    for source in sources:
        if "serviceAccountToken" in source:
            kinds.add("token")
        elif (source.get("configMap") or {}).get("name") == "kube-root-ca.crt":
            kinds.add("ca")
        elif "downwardAPI" in source:
            items = source["downwardAPI"].get("items") or ()
            paths = {item.get("fieldRef", {}).get("fieldPath") for item in items}
            if paths != {"metadata.namespace"}:
                return False
            kinds.add("namespace")
        else:
            return False
    return "token" in kinds
