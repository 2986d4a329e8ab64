"""`pool_endpoints`: what a gateway's model-server cluster holds for a pool, in either generation."""

from __future__ import annotations

from typing import Any

import pytest

from harness.cluster.builders import PodBuilder, PoolBuilder
from harness.cluster.releases import V1, V1ALPHA2, Generation
from harness.dataplane.pool_endpoints import pool_app_protocol, pool_endpoints, pool_fails_open


def pod(name: str, ip: str | None, *, ready: bool = True, app: str = "vllm", deleting: bool = False) -> Any:
    body = PodBuilder(name).namespace("ns").labels({"app": app}).build()
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    body["status"] = {"conditions": conditions, **({"podIP": ip} if ip else {})}
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return body


PODS = [
    pod("ready", "127.0.0.2"),
    pod("not-ready", "127.0.0.3", ready=False),
    pod("no-address", None),
    pod("deleting", "127.0.0.4", deleting=True),
    pod("other-app", "127.0.0.5", app="other"),
    pod("also-ready", "127.0.0.6"),
]


@pytest.mark.parametrize(
    ("generation", "ports", "expected"),
    [
        pytest.param(V1, (8000,), ("127.0.0.2:8000", "127.0.0.6:8000"), id="v1-one-port"),
        pytest.param(
            V1,
            (8000, 8001),
            ("127.0.0.2:8000", "127.0.0.2:8001", "127.0.0.6:8000", "127.0.0.6:8001"),
            id="v1-data-parallel-ranks",
        ),
        pytest.param(V1ALPHA2, (8000,), ("127.0.0.2:8000", "127.0.0.6:8000"), id="v1alpha2"),
    ],
)
def test_ready_selected_pods_times_target_ports(
    generation: Generation, ports: tuple[int, ...], expected: tuple[str, ...]
) -> None:
    pool = (
        PoolBuilder("p")
        .namespace("ns")
        .selector(app="vllm")
        .ports(*ports)
        .extension_ref("epp")
        .build(generation)
    )
    assert pool_endpoints(pool, PODS) == expected


@pytest.mark.parametrize(
    ("protocol", "failure_mode", "expected"),
    [
        pytest.param(None, None, ("http", False), id="crd-defaults"),
        pytest.param("kubernetes.io/h2c", "FailOpen", ("kubernetes.io/h2c", True), id="h2c-fail-open"),
        pytest.param("http", "FailClose", ("http", False), id="http-fail-close"),
    ],
)
def test_app_protocol_and_failure_mode(protocol: str | None, failure_mode: str | None, expected: Any) -> None:
    builder = PoolBuilder("p").selector(app="vllm").port(8000).extension_ref("epp", failure_mode=failure_mode)
    if protocol is not None:
        builder.app_protocol(protocol)
    pool = builder.build(V1)
    assert (pool_app_protocol(pool), pool_fails_open(pool)) == expected


def test_a_v1alpha2_pool_fails_open_from_its_extension_ref() -> None:
    pool = (
        PoolBuilder("p")
        .selector(app="vllm")
        .port(8000)
        .extension_ref("epp", failure_mode="FailOpen")
        .build(V1ALPHA2)
    )
    assert pool_fails_open(pool)
