"""Every HTTP/2 attack of `harness.stress.h2_attacks`, aimed at a real EPP process's ext_proc port
(TLS, the ext_proc method, the EPP's own limits), is stopped as the in-process server stops it, while
ordinary requests through Envoy, which shares that port, keep being answered: the limits stop the
attacker and never Envoy's own connection.

Our EPP only (the limits are ours; `--h2-*` flags shorten the preface and header timeouts so the slow
attacks end in a second). `python -m harness.stress.h2_attacks` is checked on the same EPP.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx2
import pytest

from harness.beds.stack import BASE_MODEL, Stack, StackOptions
from harness.plugin.core import namespace_name
from harness.plugin.stack_fixtures import StackFactory
from harness.scenarios.support import cluster_of, wait_routable
from harness.sim import SimConfig
from harness.stress import h2_attacks as a

pytestmark = pytest.mark.e2e

POD = "attacked-0"
SHORT_TIMEOUT = "1s"
FEW_RESETS = 5


@pytest.fixture(scope="module")
def shared_stack_options(request: pytest.FixtureRequest) -> StackOptions:
    return StackOptions(
        namespace=namespace_name(request.module.__name__),
        pods=0,
        sim_config=SimConfig(model=BASE_MODEL, time_scale=0.001),
        epp_args=(f"--h2-preface-timeout={SHORT_TIMEOUT}", f"--h2-header-timeout={SHORT_TIMEOUT}"),
    )


@pytest.fixture(scope="module")
def stack(shared_stack: Stack) -> Stack:
    if shared_stack.epp is None:
        pytest.skip("the attack expectations are our EPP's limits (--epp-command runs another EPP)")
    cluster_of(shared_stack).add_pods([cluster_of(shared_stack).pod_body(POD)])
    wait_routable(shared_stack, [POD])
    return shared_stack


def target(stack: Stack) -> a.Target:
    assert stack.epp is not None
    tls = ssl.create_default_context(cadata=stack.epp.ext_proc_tls.ca_pem.decode())
    tls.set_alpn_protocols(["h2"])
    return a.Target("127.0.0.1", stack.epp.grpc_port, tls, server_name=stack.epp.server_name)


async def ask(http: httpx2.AsyncClient, headers: dict[str, str]) -> None:
    """One ordinary completion through Envoy, which must be answered."""
    body = {"model": BASE_MODEL, "prompt": "hello", "max_tokens": 1}
    response = await http.post("/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("name", list(a.STOPPED_BY_OUR_EPP))
def test_an_attack_on_the_ext_proc_port_is_stopped_and_requests_through_envoy_are_answered(
    stack: Stack, name: str
) -> None:
    headers = cluster_of(stack).objective_headers(BASE_MODEL)

    async def scenario() -> tuple[a.Outcome, int]:
        async with httpx2.AsyncClient(base_url=stack.base_url, timeout=30) as http:
            await ask(http, headers)  # Envoy's connection to the EPP is open before the attack
            attack = asyncio.create_task(a.ATTACKS[name](target(stack), a.SECONDS.get(name, 10.0)))
            answered = 0
            while not attack.done():
                await ask(http, headers)
                answered += 1
            outcome = await attack
            await ask(http, headers)
            return outcome, answered

    outcome, answered = asyncio.run(scenario())
    assert a.STOPPED_BY_OUR_EPP[name](outcome), f"{name}: {outcome}"
    assert answered > 0, f"no request through Envoy was answered while {name} ran"
    assert stack.epp is not None
    assert stack.epp.running


def test_the_command_line_prints_what_the_epp_answered(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stack.epp is not None
    ca = tmp_path / "ca.crt"
    ca.write_bytes(stack.epp.ext_proc_tls.ca_pem)
    port, server_name = str(stack.epp.grpc_port), stack.epp.server_name
    a.main(["--port", port, "--ca", str(ca), "--server-name", server_name, "--only", "malformed-preface"])
    assert capsys.readouterr().out.split()[:2] == ["malformed-preface", f"goaway={a.PROTOCOL_ERROR}"]


def test_envoys_own_stream_resets_never_count_as_a_flood(stack_factory: StackFactory) -> None:
    """Envoy resets the ext_proc stream of a request it has had its answers on, once per request: at
    a few thousand requests a second, past the default 1,000 resets a second, counting those ended
    Envoy's connection (ENHANCE_YOUR_CALM) and failed the requests in flight on it. Here the EPP
    allows 5 resets a second and is sent 80 requests, 4 at a time, in a second or two. (Not more at a
    time: the one pod's queue would pass the saturation threshold and the sheddable requests get 429,
    which says nothing about resets; 8 at a time did so once in a CI run under load.)"""
    stack = stack_factory(
        pods=0,
        sim_config=SimConfig(model=BASE_MODEL, time_scale=0.001),
        epp_args=(f"--h2-max-resets-per-second={FEW_RESETS}",),
    )
    if stack.epp is None:
        pytest.skip("the reset limit is our EPP's (--epp-command runs another EPP)")
    cluster_of(stack).add_pods([cluster_of(stack).pod_body(POD)])
    wait_routable(stack, [POD])
    headers = cluster_of(stack).objective_headers(BASE_MODEL)

    async def burst() -> None:
        async with httpx2.AsyncClient(base_url=stack.base_url, timeout=30) as http:
            for _ in range(20):
                await asyncio.gather(*(ask(http, headers) for _ in range(4)))

    asyncio.run(burst())
    log = stack.epp.log_tail(2000)
    assert "over the rate limit" not in log, log
