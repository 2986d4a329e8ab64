"""Any EPP command line behind Envoy (`harness.subject.foreign_epp`): started with upstream's flag names and a
certificate Envoy verifies, ready only when health says SERVING and ext_proc completes a TLS
handshake, then routing real requests to the pool's pods.

Upstream's Go EPP v0.3.0 runs here only when it is built (`harness build --upstream-epp v0.3.0`);
otherwise its case is skipped with that command.
"""

from __future__ import annotations

import httpx2
import pytest

from harness.beds.stack import FIXED_PORT_WAIT_S
from harness.cluster import go_binaries
from harness.dataplane.envoy import Envoy, EnvoyOptions
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import cluster_of, endpoint, served_by
from harness.subject.foreign_epp import EppCommand, ForeignEpp, sim_metric_args

pytestmark = pytest.mark.e2e


def _upstream() -> EppCommand:
    if go_binaries.find_upstream_epp() is None:
        pytest.skip(
            f"upstream EPP v{go_binaries.UPSTREAM_EPP_VERSION} not built: run "
            f"`.venv/bin/harness build --upstream-epp v{go_binaries.UPSTREAM_EPP_VERSION}` (about 4 minutes)"
        )
    return EppCommand.upstream()


COMMANDS = {"ours": EppCommand.ours, "upstream-v0.3.0": _upstream}


@pytest.mark.parametrize("which", list(COMMANDS))
def test_an_epp_command_line_routes_behind_envoy(stack_factory: StackFactory, which: str) -> None:
    command = COMMANDS[which]()
    stack = stack_factory(pods=2)
    pods = {endpoint(stack, name) for name in cluster_of(stack).pods}
    options = stack.options
    with ForeignEpp(
        command,
        options.pool_name,
        options.namespace,
        stack.access.kubeconfig_path,
        sim_metric_args(command),
        fixed_port_wait=FIXED_PORT_WAIT_S,  # another upstream EPP on this host may hold :8080 a while
    ) as epp:
        epp.wait_serving()
        assert epp.health() == "SERVING"
        envoy_options = EnvoyOptions(request_body_mode=command.envoy_request_body_mode)
        with (
            Envoy(epp.ext_proc_address, options=envoy_options, ext_proc_tls=epp.ext_proc_tls) as envoy,
            httpx2.Client(base_url=f"{envoy.base_url}/v1", timeout=60) as http,
        ):
            served = set()
            for _ in range(6):
                response = http.post(
                    "/completions", json={"model": "food-review", "prompt": "hi", "max_tokens": 1}
                )
                assert response.status_code == 200, response.text
                served.add(served_by(response.headers))
            assert served, "no request reached a pod"
            assert served <= pods, f"served by {served}, the pool's pods are {pods}"
