"""A pod's container as ``docker create`` flags (``harness.nodeagent.container_spec``): securityContext,
resources as the kubelet's cgroup values, Kubernetes' command/args rules, mounts."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from harness.nodeagent.container_spec import (
    ImageConfig,
    Mount,
    command_line,
    is_service_account_volume,
    quantity,
    resource_flags,
    security_flags,
)
from harness.nodeagent.images import ContainerConfigError

IMAGE = ImageConfig("epp-harness/inference-epp:abc", "sha256:" + "0" * 64, "65532:65532")
ROOT_IMAGE = ImageConfig("epp-harness/x:1", "sha256:" + "1" * 64, "")


def pod(security: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": []}
    if security is not None:
        spec["securityContext"] = security
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": spec}


def container(security: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "epp", **fields}
    if security is not None:
        spec["securityContext"] = security
    return spec


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("500m", Decimal("0.5"), id="milli-cpu"),
        pytest.param("2", Decimal(2), id="whole-cpu"),
        pytest.param("1.5", Decimal("1.5"), id="fraction"),
        pytest.param("64Mi", Decimal(64 * 2**20), id="mebibytes"),
        pytest.param("1Gi", Decimal(2**30), id="gibibytes"),
        pytest.param("128M", Decimal(128_000_000), id="megabytes"),
        pytest.param("1e3", Decimal(1000), id="exponent"),
        pytest.param(100, Decimal(100), id="a-number"),
    ],
)
def test_quantities_read_as_kubernetes_reads_them(text: str | int, value: Decimal) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["", "ten", "5Xi", "1.2.3"])
def test_a_malformed_quantity_is_a_config_error(text: str) -> None:
    with pytest.raises(ContainerConfigError):
        quantity(text)


CHART = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}


@pytest.mark.parametrize(
    ("pod_security", "own", "image", "flags"),
    [
        pytest.param(
            {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}, CHART, IMAGE,
            ["--security-opt", "no-new-privileges", "--read-only", "--cap-drop", "ALL"],
            id="the-chart-image-user-non-root",
        ),
        pytest.param(None, {"runAsUser": 1000, "runAsGroup": 2000}, IMAGE, ["--user", "1000:2000"],
                     id="run-as-user-and-group"),
        pytest.param({"runAsUser": 1000}, {"runAsUser": 3000}, ROOT_IMAGE, ["--user", "3000"],
                     id="the-container-wins-over-the-pod"),
        pytest.param({"runAsUser": 1000, "runAsNonRoot": True}, None, ROOT_IMAGE, ["--user", "1000"],
                     id="the-pod-user-makes-a-root-image-non-root"),
        pytest.param({"fsGroup": 2000, "supplementalGroups": [3000]}, None, IMAGE,
                     ["--group-add", "2000", "--group-add", "3000"], id="fs-and-supplemental-groups"),
        pytest.param(None, {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}, IMAGE,
                     ["--cap-drop", "ALL", "--cap-add", "NET_BIND_SERVICE"], id="capabilities"),
        pytest.param(None, {"privileged": True}, ROOT_IMAGE, ["--privileged"], id="privileged"),
        pytest.param({"seccompProfile": {"type": "Unconfined"}}, None, IMAGE,
                     ["--security-opt", "seccomp=unconfined"], id="seccomp-unconfined"),
        pytest.param(None, None, ROOT_IMAGE, [], id="nothing-asked"),
    ],
)  # fmt: skip
def test_security_context_as_flags(
    pod_security: dict[str, Any] | None, own: dict[str, Any] | None, image: ImageConfig, flags: list[str]
) -> None:
    assert security_flags(pod(pod_security), container(own), image) == flags


@pytest.mark.parametrize(
    ("pod_security", "own", "image", "message"),
    [
        pytest.param(None, {"runAsNonRoot": True}, ROOT_IMAGE,
                     'container has runAsNonRoot and image will run as root (pod: "p_ns(u-1)", '
                     "container: epp)",
                     id="root-image"),
        pytest.param({"runAsNonRoot": True}, None, ImageConfig("epp-harness/x:1", "sha256:2", "nobody"),
                     "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify",
                     id="named-user"),
        pytest.param({"runAsNonRoot": True}, {"runAsUser": 0}, IMAGE,
                     "container's runAsUser breaks non-root policy", id="run-as-root"),
        pytest.param(None, {"seccompProfile": {"type": "Localhost", "localhostProfile": "x.json"}}, IMAGE,
                     "seccompProfile Localhost is not supported", id="localhost-seccomp"),
        pytest.param(None, {"seLinuxOptions": {"level": "s0"}}, IMAGE,
                     "cannot honour: seLinuxOptions", id="an-unknown-field-is-not-dropped"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_refused(
    pod_security: dict[str, Any] | None, own: dict[str, Any] | None, image: ImageConfig, message: str
) -> None:
    with pytest.raises(ContainerConfigError) as raised:
        security_flags(pod(pod_security), container(own), image)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("resources", "flags"),
    [
        pytest.param({"limits": {"cpu": "500m", "memory": "64Mi"}},
                     ["--cpu-period", "100000", "--cpu-quota", "50000", "--cpu-shares", "512",
                      "--memory", str(64 * 2**20), "--memory-swap", str(64 * 2**20)],
                     id="limits-give-requests-too"),
        pytest.param({"requests": {"cpu": "100m"}, "limits": {"cpu": "2"}},
                     ["--cpu-period", "100000", "--cpu-quota", "200000", "--cpu-shares", "102"],
                     id="cpu-request-and-limit"),
        pytest.param({"limits": {"cpu": "1m"}, "requests": {"cpu": "1m"}},
                     ["--cpu-period", "100000", "--cpu-quota", "1000", "--cpu-shares", "2"],
                     id="minimum-quota-and-shares"),
        pytest.param({"requests": {"memory": "1Gi"}}, [], id="a-memory-request-sets-no-cgroup-limit"),
        pytest.param({}, [], id="none"),
    ],
)  # fmt: skip
def test_resources_as_the_kubelets_cgroup_values(resources: dict[str, Any], flags: list[str]) -> None:
    assert resource_flags(container(resources=resources)) == flags


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({}, (None, ("--bindAddress", "127.0.1.2")), id="image-entrypoint-and-cmd"),
        pytest.param({"args": ["--pool-name", "p"]},
                     (None, ("--bindAddress", "127.0.1.2", "--pool-name", "p")), id="args-replace-cmd"),
        pytest.param({"command": ["python3", "-c", "pass"]},
                     ("python3", ("-c", "pass", "--bindAddress", "127.0.1.2")),
                     id="command-replaces-entrypoint"),
        pytest.param({"command": ["sh"], "args": ["-c", "exit 3"]},
                     ("sh", ("--bindAddress", "127.0.1.2", "-c", "exit 3")), id="command-and-args"),
    ],
)  # fmt: skip
def test_command_and_args_over_the_image(
    fields: dict[str, Any], expected: tuple[str | None, tuple[str, ...]]
) -> None:
    assert command_line(container(**fields), ("--bindAddress", "127.0.1.2")) == expected


def test_mounts() -> None:
    assert Mount("/tmp", None, tmpfs_size=16 * 2**20).flags() == [
        "--tmpfs",
        f"/tmp:rw,nosuid,nodev,size={16 * 2**20}",
    ]
    assert Mount("/var/run/secrets/kubernetes.io/serviceaccount", Path("/pods/p/sa"), True).flags() == [
        "--volume",
        "/pods/p/sa:/var/run/secrets/kubernetes.io/serviceaccount:ro",
    ]
    assert Mount("/data", Path("/pods/p/data")).flags() == ["--volume", "/pods/p/data:/data"]


NAMESPACE_ITEM = {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
KUBE_API_ACCESS = {
    "name": "kube-api-access-x7k2p",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                }
            },
        ],
    },
}


def test_the_admission_plugins_projected_volume_is_recognised_and_nothing_else() -> None:
    assert is_service_account_volume(KUBE_API_ACCESS)
    other = {"name": "x", "projected": {"sources": [{"secret": {"name": "s"}}]}}
    assert not is_service_account_volume(other)
    assert not is_service_account_volume({"name": "tmp", "emptyDir": {}})
