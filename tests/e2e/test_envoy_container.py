"""Envoy as a container (``--envoy=container`` for a whole run; here one Stack asks for it itself):
the same bootstrap and the same routing, with Envoy's process inside a container of the harness's
engine, and nothing left of it after the Stack stops."""

from __future__ import annotations

import functools
import json
import os

import openai
import pytest

from harness.base.eventually import eventually
from harness.cluster.container_engine import DockerEngine
from harness.dataplane.envoy_container import ContainerEnvoy, envoy_image
from harness.plugin.stack_fixtures import StackFactory

pytestmark = [pytest.mark.e2e, pytest.mark.containers, pytest.mark.timeout(900)]


def test_envoy_in_a_container_routes_as_the_process_does(
    container_engine: DockerEngine, stack_factory: StackFactory
) -> None:
    image = envoy_image(container_engine)
    factory = functools.partial(ContainerEnvoy, engine=container_engine, image=image.tag)
    stack = stack_factory(pods=2, envoy_factory=factory)
    envoy = stack.envoy
    assert isinstance(envoy, ContainerEnvoy)

    # Envoy's process runs in the container: its pid namespace is not ours.
    listed = container_engine.docker("ps", "-q", "--filter", f"name={envoy.container_name}").split()
    assert listed, f"no running container {envoy.container_name!r}: Envoy is not in a container"
    state = json.loads(container_engine.docker("inspect", *listed))[0]["State"]
    envoy_pid = int(state["Pid"])
    assert os.readlink(f"/proc/{envoy_pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    assert os.readlink(f"/proc/{envoy_pid}/exe").endswith("/envoy")

    verdict = stack.traffic.eventually_routes_to()
    assert verdict.consistent, verdict
    assert len(verdict.expected) == 2, verdict
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    reply = client.completions.create(model="food-review", prompt="hi", max_tokens=1)
    assert reply.choices[0].text

    def logged() -> None:
        assert envoy.access_log(), "Envoy's access log (a file in the mounted directory) is empty"

    eventually(logged, timeout=10)

    name = envoy.container_name
    stack.stop()
    assert not container_engine.docker("ps", "-aq", "--filter", f"name={name}").split(), (
        "Envoy's container remains"
    )
