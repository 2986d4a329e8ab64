"""The optional kinds' CRDs really absent at start, then installed (upstream #1737: its EPP
crash-looped without the InferenceObjective CRD, and looks for the kinds only at start-up).

The EPP-agnostic scenario (`harness.scenarios.conformance.test_optional_kinds`) takes the kinds away
by RBAC on the shared plane, whose CRDs every other test uses. Here the plane is this test's own, so
the InferenceObjective and InferenceModelRewrite CRDs are not installed before our EPP starts (a 404
on the list, not a 403): it must serve, warn once per kind, and honour an objective and a rewrite
once the CRDs are installed, with no restart. v1 only: v1alpha2's InferenceModel is required, not optional.
"""

from __future__ import annotations

import httpx2
import pytest

from harness.base.eventually import eventually
from harness.beds.stack import BASE_MODEL, Stack, StackOptions
from harness.cluster import crds, releases
from harness.cluster.controlplane import ControlPlane
from harness.cluster.releases import MODEL_KINDS_GROUP, V1
from harness.scenarios.support import CLIENT_TIMEOUT_S

pytestmark = [pytest.mark.e2e, pytest.mark.api_generation(V1.name), pytest.mark.timeout(300)]

NAMESPACE = "no-optional-crds"  # the plane is this test's own: any name will do
ALIAS = "alias"
ABSENT_WARNING = "not served (no CRD?)"
# Past our EPP's look-again backoff at its cap (10 s), with room for a loaded machine.
PICKED_UP_S = 60.0


def optional_crd_names() -> list[str]:
    return [f"{plural}.{MODEL_KINDS_GROUP}" for plural in V1.model_plurals]


def absent_warnings(stack: Stack) -> list[str]:
    assert stack.epp_process is not None
    return [line for line in stack.epp_process.log_tail(2000).splitlines() if ABSENT_WARNING in line]


def complete(stack: Stack, model: str) -> httpx2.Response:
    assert stack.cluster is not None
    with httpx2.Client(base_url=stack.base_url, timeout=CLIENT_TIMEOUT_S) as http:
        body = {"model": model, "prompt": "are the optional kinds there", "max_tokens": 1}
        return http.post("/completions", json=body, headers=stack.cluster.objective_headers(model))


def test_without_the_optional_crds_the_epp_serves_warns_once_and_honours_them_once_installed(
    pytestconfig: pytest.Config,
) -> None:
    release = pytestconfig.getoption("crd_release") or releases.default_release()
    with ControlPlane(crd_release=release, install_crds=False) as plane:
        with plane.access.api_client() as api:
            crds.install_crds(api, release=release, without=optional_crd_names())
        options = StackOptions(NAMESPACE, pods=2, models=(), probe_model=BASE_MODEL)
        with Stack(plane.access, options) as stack:
            assert stack.cluster is not None
            assert stack.traffic is not None
            assert stack.epp_process is not None
            pid = stack.epp_process.pid
            # Serving without them: the base model passes through by name, as every v1 EPP serves it.
            stack.traffic.eventually_routes_to(sorted(stack.cluster.pods))
            warnings = absent_warnings(stack)
            assert len(warnings) == len(V1.model_plurals), "\n".join(warnings) or "no warning logged"

            with plane.access.api_client() as api:
                crds.install_crds(api, release=release)
            # An objective (Sheddable: priority -2) and a rewrite of the alias to the base model.
            stack.cluster.apply_model(ALIAS, criticality="Sheddable", targets=((BASE_MODEL, None),))

            [objective] = stack.cluster.objective_headers(ALIAS).values()  # the header names it

            def honoured() -> None:
                view = stack.datastore_view()
                priorities = {o["name"]: o["priority"] for o in view["objectives"]}
                assert priorities.get(objective) == -2, priorities
                response = complete(stack, ALIAS)
                assert response.status_code == 200, f"{ALIAS}: {response.status_code} {response.text!r}"

            eventually(honoured, timeout=PICKED_UP_S, message="the objective and rewrite are honoured")
            assert stack.epp_process.running, "the EPP exited on the way"
            assert stack.epp_process.pid == pid, "the EPP restarted"
            assert absent_warnings(stack) == warnings, "an absent kind was warned about more than once"
