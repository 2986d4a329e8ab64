"""The image map, probe specs and the container environment: what the agent reads from a pod spec."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.nodeagent import probes
from harness.nodeagent.images import DEFAULT_IMAGES, ImageRef, LaunchContext, PauseRuntime, image_id
from harness.nodeagent.pod import Backoff, BackoffPolicy, _hook_sleep_seconds, container_env, expand
from harness.nodeagent.runtime import Executable, PythonEntry


@pytest.mark.parametrize(
    ("image", "entry"),
    [
        pytest.param("epp-harness/vllm-sim:latest", "harness.sim._cli:main", id="ours"),
        pytest.param("localhost:5000/epp-harness/vllm-sim", "harness.sim._cli:main", id="ours-elsewhere"),
        pytest.param("ghcr.io/llm-d/llm-d-inference-sim:v0.1.1", "harness.sim._llmd:main", id="llm-d"),
        pytest.param("ghcr.io/llm-d/llm-d-inference-sim@sha256:abc", "harness.sim._llmd:main", id="digest"),
    ],
)
def test_simulator_images_run_our_simulator_with_their_own_command_line(image: str, entry: str) -> None:
    runtime = DEFAULT_IMAGES.resolve(image)
    assert runtime is not None
    command = asyncio.run(runtime.prepare({"args": ["--port", "8000"]}, context()))
    assert command == PythonEntry(entry, ("--port", "8000"))
    assert entry.partition(":")[0] in DEFAULT_IMAGES.preload, "imported by the zygote up front"


@pytest.mark.parametrize(
    "image", ["nginx", "docker.io/llm-d/llm-d-inference-sim:v1", "vllm/vllm-openai:latest", "pause:3.10"]
)
def test_anything_else_is_unknown(image: str) -> None:
    assert DEFAULT_IMAGES.resolve(image) is None


def test_pause_waits_for_a_signal() -> None:
    runtime = DEFAULT_IMAGES.resolve("registry.k8s.io/pause:3.10")
    assert isinstance(runtime, PauseRuntime)
    command = asyncio.run(runtime.prepare({}, context()))
    assert isinstance(command, Executable | PythonEntry)


def test_image_references_and_ids() -> None:
    assert ImageRef.parse("localhost:5000/a/b:1.2@sha256:ff") == ImageRef(
        "localhost:5000/a/b", "1.2", "sha256:ff"
    )
    assert ImageRef.parse("localhost:5000/a/b") == ImageRef("localhost:5000/a/b", "", "")
    assert image_id("a/b@sha256:ff") == "a/b@sha256:ff"
    assert image_id("a/b:1") == image_id("a/b:1")
    assert image_id("a/b:1").startswith("a/b@sha256:")


def context() -> LaunchContext:
    return LaunchContext(pod={}, pod_ip="127.0.3.4", workdir=Path("/tmp"), api_server_host="127.0.0.1",
                         api_server_port="6443")  # fmt: skip


CONTAINER: dict[str, Any] = {"name": "c", "ports": [{"name": "http", "containerPort": 8000}]}


def test_probe_defaults_and_named_ports() -> None:
    probe = probes.parse({"httpGet": {"path": "/health", "port": "http"}}, CONTAINER, {})
    assert probe == probes.Probe("http", 8000, path="/health")
    assert (probe.period, probe.timeout, probe.failure_threshold, probe.success_threshold) == (10, 1, 3, 1)


def test_the_probe_period_annotation_is_the_harness_knob() -> None:
    raw = {"tcpSocket": {"port": 8000}, "periodSeconds": 1}
    probe = probes.parse(raw, CONTAINER, {probes.PROBE_PERIOD_ANNOTATION: "0.1"})
    assert probe is not None
    assert probe.period == 0.1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param({"httpGet": {"port": "metrics"}}, "does not declare", id="unknown-named-port"),
        pytest.param({"periodSeconds": 3}, "needs one of", id="no-handler"),
    ],
)
def test_unusable_probes_are_config_errors(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(probes.ProbeConfigError, match=message):
        probes.parse(raw, CONTAINER, {})


def test_an_exec_probe_always_fails_and_says_why() -> None:
    probe = probes.parse({"exec": {"command": ["true"]}}, CONTAINER, {})
    assert probe is not None
    result = asyncio.run(probes.Prober().check(probe, "127.0.0.1"))
    assert not result.ok
    assert "not supported" in result.detail


def test_variable_expansion_as_kubernetes_does_it() -> None:
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", env) == "1-two"
    assert expand("$(MISSING)", env) == "$(MISSING)"
    assert expand("$$(A)", env) == "$(A)", "$$ escapes"


def test_environment_injected_and_resolved() -> None:
    worker: Any = SimpleNamespace(
        name="p1", namespace="ns", uid="u1", node="n1", ip="127.0.3.4",
        pod={"metadata": {"labels": {"app": "x"}}, "spec": {"serviceAccountName": "sa"}},
        ctx=SimpleNamespace(host_ip="127.0.0.1", api_server=("127.0.0.1", "6443")),
    )  # fmt: skip
    spec = {"env": [
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "WHERE", "value": "$(NAME)@$(EPP_HARNESS_POD_IP)"},
    ]}  # fmt: skip
    env = container_env(spec, worker)
    assert env["NAME"] == "p1"
    assert env["APP"] == "x"
    assert env["WHERE"] == "p1@127.0.3.4"
    assert env["HOSTNAME"] == "p1"
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")


@pytest.mark.parametrize(
    ("hook", "seconds"),
    [
        pytest.param({"sleep": {"seconds": 5}}, 5.0, id="sleep-action"),
        pytest.param({"exec": {"command": ["/bin/sleep", "7"]}}, 7.0, id="exec-sleep"),
        pytest.param({"exec": {"command": ["sh", "-c", "sleep 3"]}}, 3.0, id="shell-sleep"),
        pytest.param({"exec": {"command": ["/bin/drain"]}}, None, id="anything-else"),
    ],
)
def test_pre_stop_hooks_the_agent_can_run(hook: dict[str, Any], seconds: float | None) -> None:
    assert _hook_sleep_seconds(hook) == seconds


def test_crash_loop_backoff_first_restart_at_once_then_doubling_to_the_cap() -> None:
    backoff = Backoff(BackoffPolicy(initial=0.5, maximum=2.0))
    assert [backoff.next() for _ in range(5)] == [0.0, 0.5, 1.0, 2.0, 2.0]
    assert backoff.next(ran_for=10.0) == 0.0, "a container that ran long enough starts over"
