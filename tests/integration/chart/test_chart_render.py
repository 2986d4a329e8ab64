"""What the chart renders for each pool generation (``inferencePool.apiVersion``), read as objects.

The pool (v1 by default: ``selector.matchLabels``, ``targetPorts``, ``endpointPickerRef`` with its
port; v1alpha2 as v0.3.0 wrote it), the Role (the pool's group; InferenceObjective and
InferenceModelRewrite in v1, InferenceModel in v1alpha2; leases only in HA mode) and the EPP's
arguments (upstream v1.5.0's kebab-case names, the pool group following the pool), which our EPP's own
flag parser must take as they are. Rendered with the real helm; no cluster needed (the server-side
dry run of the same objects is ``test_chart_checks``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.server.flags import parse_flags
from harness.cluster import releases
from harness.cluster.helm import Helm, HelmError

V1 = releases.V1.pool_api_version
V1ALPHA2 = releases.V1ALPHA2.pool_api_version
SELECTOR = {"inferencePool.modelServers.matchLabels.app": "vllm"}
RELEASE, NAMESPACE = "vllm-pool", "serving"
READ = ["get", "list", "watch"]


@pytest.fixture
def helm(tmp_path: Path) -> Helm:
    return Helm(tmp_path / "helm-home")


def render(helm: Helm, **sets: str) -> dict[str, list[dict[str, Any]]]:
    """The chart's objects by kind, rendered with the selector and ``sets``."""
    manifest = helm.template(RELEASE, NAMESPACE, set_values={**SELECTOR, **sets})
    objects: dict[str, list[dict[str, Any]]] = {}
    for document in yaml.safe_load_all(manifest):
        if isinstance(document, dict) and document.get("kind"):
            objects.setdefault(document["kind"], []).append(document)
    return objects


def one(objects: Mapping[str, list[dict[str, Any]]], kind: str) -> dict[str, Any]:
    [found] = objects[kind]
    return found


def container(objects: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    [epp] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(epp)


def rules(objects: Mapping[str, list[dict[str, Any]]]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(group, resource, verbs) of every Role's rules."""
    return [
        (group, resource, tuple(rule["verbs"]))
        for role in objects["Role"]
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    ]


def parsed(objects: Mapping[str, list[dict[str, Any]]]) -> Any:
    """The Deployment's args through our EPP's flag parser (its env as the pod would have it)."""
    epp = container(objects)
    environ = {e["name"]: e.get("value", "from-the-downward-api") for e in epp.get("env") or ()}
    return parse_flags(epp["args"], environ).config


def test_the_default_pool_is_v1_with_match_labels_target_ports_and_an_endpoint_picker_ref(helm: Helm) -> None:
    pool = one(render(helm), "InferencePool")
    assert pool["apiVersion"] == V1
    assert pool["spec"] == {
        "targetPorts": [{"number": 8000}],
        "selector": {"matchLabels": {"app": "vllm"}},
        "endpointPickerRef": {"name": f"{RELEASE}-epp", "port": {"number": 9002}, "failureMode": "FailClose"},
    }


def test_a_v1_pool_takes_several_ports_and_the_model_servers_protocol(helm: Helm) -> None:
    sets = {"inferencePool.targetPorts[0].number": "8000", "inferencePool.targetPorts[1].number": "8001"}
    spec = one(render(helm, **sets, **{"inferencePool.modelServerProtocol": "grpc"}), "InferencePool")["spec"]
    assert spec["targetPorts"] == [{"number": 8000}, {"number": 8001}]
    assert spec["appProtocol"] == "kubernetes.io/h2c"
    assert (
        one(render(helm, **{"inferencePool.modelServerProtocol": "http"}), "InferencePool")["spec"][
            "appProtocol"
        ]
        == "http"
    )


def test_v1alpha2_is_still_selectable(helm: Helm) -> None:
    objects = render(helm, **{"inferencePool.apiVersion": V1ALPHA2})
    pool = one(objects, "InferencePool")
    assert pool["apiVersion"] == V1ALPHA2
    assert pool["spec"] == {
        "targetPortNumber": 8000,
        "selector": {"app": "vllm"},
        "extensionRef": {"name": f"{RELEASE}-epp", "portNumber": 9002, "failureMode": "FailClose"},
    }
    assert sorted(rules(objects)) == [
        ("", "pods", tuple(READ)),
        (releases.MODEL_KINDS_GROUP, "inferencemodels", tuple(READ)),
        (releases.MODEL_KINDS_GROUP, "inferencepools", tuple(READ)),
    ]
    assert parsed(objects).pool_group == releases.MODEL_KINDS_GROUP


def test_the_v1_role_reads_the_pool_objectives_and_rewrites_and_nothing_else(helm: Helm) -> None:
    assert sorted(rules(render(helm))) == [
        ("", "pods", tuple(READ)),
        (releases.V1.pool_group, "inferencepools", tuple(READ)),
        (releases.MODEL_KINDS_GROUP, "inferencemodelrewrites", tuple(READ)),
        (releases.MODEL_KINDS_GROUP, "inferenceobjectives", tuple(READ)),
    ]


def test_the_epp_gets_upstream_v1_5_flag_names_and_the_pools_group(helm: Helm) -> None:
    objects = render(helm, **{"inferenceExtension.tlsSecretName": "epp-tls"})
    args = container(objects)["args"]
    names = [a for a in args if a.startswith("--")]
    assert names == [
        "--pool-name", "--pool-namespace", "--pool-group", "--grpc-port", "--grpc-health-port",
        "--metrics-port", "--cert-path",
    ]  # fmt: skip
    config = parsed(objects)
    assert (config.pool_name, config.pool_namespace, config.pool_group) == (
        RELEASE, NAMESPACE, releases.V1.pool_group,
    )  # fmt: skip
    assert (config.grpc_port, config.grpc_health_port, config.metrics_port) == (9002, 9003, 9090)
    assert config.cert_path == "/etc/epp/tls"
    assert not config.leader_election.enabled


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param(
            {"inferenceExtension.flags.v": "3", "inferenceExtension.flags.shutdown-delay": "2s"}, id="map"
        ),
        pytest.param(
            {
                "inferenceExtension.flags[0].name": "v",
                "inferenceExtension.flags[0].value": "3",
                "inferenceExtension.flags[1].name": "shutdown-delay",
                "inferenceExtension.flags[1].value": "2s",
            },
            id="list-of-name-value",
        ),
    ],
)
def test_extra_flags_are_passed_as_name_value_pairs(helm: Helm, sets: dict[str, str]) -> None:
    args = container(render(helm, **sets))["args"]
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert (pairs["--v"], pairs["--shutdown-delay"]) == ("3", "2s")


def test_leases_and_leader_election_only_in_ha_mode(helm: Helm) -> None:
    plain = render(helm, **{"inferenceExtension.replicas": "2"})
    assert not any(resource == "leases" for _, resource, _ in rules(plain)), "active-active needs no Lease"
    assert one(plain, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"
    ha = render(helm, **{"inferenceExtension.replicas": "2", "inferenceExtension.leaderElection": "true"})
    assert ("coordination.k8s.io", "leases", ("get", "create", "update")) in rules(ha)
    assert len(ha["RoleBinding"]) == 2
    config = parsed(ha)
    assert config.leader_election.enabled
    assert config.leader_election.identity == "from-the-downward-api", "POD_NAME names the replica"
    assert one(ha, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert "tcpSocket" in container(ha)["livenessProbe"], "a standby is not SERVING, yet alive"


def test_the_pool_object_is_optional(helm: Helm) -> None:
    objects = render(helm, **{"inferencePool.create": "false"})
    assert "InferencePool" not in objects
    assert (releases.V1.pool_group, "inferencepools", tuple(READ)) in rules(objects)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        pytest.param(
            {"inferencePool.apiVersion": f"{releases.V1.pool_group}/v2"},
            "not a pool generation",
            id="unknown-api-version",
        ),
        pytest.param({"inferencePool.modelServerProtocol": "tcp"}, "use http or grpc", id="unknown-protocol"),
        pytest.param(
            {
                "inferencePool.apiVersion": V1ALPHA2,
                "inferencePool.targetPorts[0].number": "8000",
                "inferencePool.targetPorts[1].number": "8001",
            },
            "a v1alpha2 pool has one port",
            id="v1alpha2-with-two-ports",
        ),
    ],
)
def test_values_that_cannot_work_fail_the_rendering_with_a_message(
    helm: Helm, sets: dict[str, str], message: str
) -> None:
    with pytest.raises(HelmError, match=message):
        render(helm, **sets)
