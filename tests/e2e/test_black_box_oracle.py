"""The black-box oracle catches a real defect on its own: our EPP with a planted bug (pods being deleted
stay routable, `tests.e2e.planted_epp`), run as a foreign EPP with no ``/debug/datastore`` the harness
knows of, is told apart from our EPP by traffic alone (`harness.verdicts.traffic_oracle`).

The control case runs the same scenario against our EPP through the same launcher, also judged by
traffic only: the oracle passes it, so a failure of the planted case is the defect, not the oracle.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.beds.stack import BASE_MODEL, ModelSpec
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import cluster_of
from harness.subject import flag_profiles
from harness.subject.foreign_epp import EppCommand

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MODELS = (ModelSpec("base", "base", "Critical", ((BASE_MODEL, None),)),)
PRE_STOP_S = 120  # the terminating pod stays Ready and serving for the whole test
DEFECT_TIMEOUT_S = 20.0  # our EPP converges within a round or two; the planted one never does

PLANTED = EppCommand(
    (sys.executable, "-m", "tests.e2e.planted_epp"),
    "upstream",
    (),
    "epp with a planted defect",
    flags=flag_profiles.V1,  # our flag names: it is told the pool group
)


@pytest.mark.parametrize("planted", [pytest.param(False, id="ours"), pytest.param(True, id="planted-defect")])
def test_traffic_alone_tells_a_terminating_pod_kept_routable(
    stack_factory: StackFactory, planted: bool
) -> None:
    command = PLANTED if planted else EppCommand.ours()
    stack = stack_factory(pods=2, models=MODELS, epp_command=command, epp_env={"PYTHONPATH": str(REPO)})
    assert stack.white_box is not planted, "the planted EPP must be judged without a datastore view"
    traffic = stack.traffic
    assert traffic is not None
    cluster = cluster_of(stack)
    cluster.add_pod("leaving", pre_stop=PRE_STOP_S)
    traffic.eventually_routes_to(sorted(cluster.pods))  # the EPP under test took the write that adds it

    cluster.terminate_pod("leaving")
    assert "leaving" not in traffic.expected_members(), "the API server shows the pod terminating"

    if not planted:
        traffic.eventually_routes_to(timeout=DEFECT_TIMEOUT_S)
        return
    with pytest.raises(AssertionError) as caught:
        traffic.eventually_routes_to(timeout=DEFECT_TIMEOUT_S)
    assert "non-members that got traffic: leaving=" in str(caught.value)
    assert all(verdict.received.get("leaving") for verdict in traffic.rounds[-2:]), (
        "the terminating pod kept getting traffic round after round"
    )
