"""The optional kinds (InferenceObjective, InferenceModelRewrite) are not there for the EPP at start,
then they are (upstream #1737: the EPP crash-looped without the InferenceObjective CRD; istio.io
#17528: unhealthy when RBAC lacked it; and upstream looks for them only at start-up, so what appears
later is never watched: upstream-v1.md §g.4).

"Not there" is an EPP identity whose Role grants the pool and pods but not the optional kinds (a
403 is what a Role lacking them gives, as a 404 is what a cluster lacking the CRD gives; the CRDs
themselves are the whole run's, shared by every test, so they stay). The EPP must serve without
them; once the Role grants them, a rewrite written before must be honoured, with no restart.
Only v1 has optional kinds (v1alpha2's InferenceModel is required): not applicable to a v1alpha2 run.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from kubernetes import client

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, Stack
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.identities import service_account_access
from harness.cluster.releases import MODEL_KINDS_GROUP, V1
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import CLIENT_TIMEOUT_S, cluster_of

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.epp_agnostic,
    pytest.mark.api_generation("v1"),
    pytest.mark.needs("model-aware-routing"),
    pytest.mark.upstream_bug("optional-kinds-forbidden-never-serves"),
]

ACCOUNT = "epp-without-optional-kinds"
ALIAS = "alias"
READ = ["get", "list", "watch"]
# Past the longest look-again wait of a client-go informer (its reflector retries a failed list after
# at most 30 s plus up to 100% jitter: 60 s; client-go v0.35 `tools/cache/reflector.go`), with room
# for a loaded machine. Our EPP's backoff caps at 10 s; an EPP that never looks again still fails.
PICKED_UP_S = 90.0


def role(with_optional_kinds: bool) -> client.V1Role:
    rules = [
        client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=READ),
        client.V1PolicyRule(api_groups=[V1.pool_group], resources=["inferencepools"], verbs=READ),
    ]
    if with_optional_kinds:
        optional = list(V1.model_plurals)
        rules.append(client.V1PolicyRule(api_groups=[MODEL_KINDS_GROUP], resources=optional, verbs=READ))
    return client.V1Role(metadata=client.V1ObjectMeta(name=ACCOUNT), rules=rules)


def narrow_identity(access: ClusterAccess, namespace: str, directory: Path) -> Path:
    """A ServiceAccount bound to ``role(False)``; its kubeconfig."""
    with access.api_client() as admin:
        rbac = client.RbacAuthorizationV1Api(admin)
        rbac.create_namespaced_role(namespace, role(False))
        binding = client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=ACCOUNT),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=ACCOUNT),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=ACCOUNT, namespace=namespace)],
        )
        rbac.create_namespaced_role_binding(namespace, binding)
    return service_account_access(access, namespace, ACCOUNT, directory=directory).kubeconfig_path


def complete(stack: Stack, model: str) -> httpx2.Response:
    with httpx2.Client(base_url=stack.base_url, timeout=CLIENT_TIMEOUT_S) as http:
        body = {"model": model, "prompt": "is the rewrite there", "max_tokens": 1}
        return http.post("/completions", json=body, headers=cluster_of(stack).objective_headers(model))


def test_an_epp_without_the_optional_kinds_serves_and_honours_them_once_they_are_there(
    stack_factory: StackFactory, control_plane: ClusterAccess, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = narrow_identity(control_plane, namespace, tmp_path)
    # No model objects: the base model passes through by name, as every v1 EPP serves it.
    try:
        stack = stack_factory(pods=2, models=(), probe_model=BASE_MODEL, epp_kubeconfig=kubeconfig)
    except AssertionError as exc:
        if " serving pool " not in str(exc):
            raise  # any other start failure stays one (never a behaviour of the EPP's)
        # The EPP started and never reported SERVING: that is the behaviour under test, the known
        # upstream bug, so it fails here rather than as a Stack that could not start.
        raise AssertionError(f"never serving with a Role without the optional kinds: {exc}") from None
    cluster = cluster_of(stack)
    assert stack.traffic is not None
    stack.traffic.eventually_routes_to(sorted(cluster.pods))  # serving, without the optional kinds

    cluster.apply_model(ALIAS, criticality="Critical", targets=((BASE_MODEL, None),))
    unseen = complete(stack, ALIAS)
    assert unseen.status_code != 200, "the EPP read the rewrite although its Role does not grant it"

    with control_plane.api_client() as admin:
        client.RbacAuthorizationV1Api(admin).replace_namespaced_role(ACCOUNT, namespace, role(True))

    def honoured() -> None:
        response = complete(stack, ALIAS)
        assert response.status_code == 200, f"{ALIAS}: {response.status_code} {response.text!r}"

    eventually(honoured, timeout=PICKED_UP_S, message=f"{ALIAS} is rewritten once it may be read")
    assert stack.epp_process is not None
    assert stack.epp_process.running, "the EPP exited on the way"
