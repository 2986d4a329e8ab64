"""`Epp` end to end on loopback: ports, health, /metrics, /debug/datastore, TLS, failure, shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.api import v1alpha2
from epp.config import V1_POOL_GROUP, V1ALPHA2_POOL_GROUP
from epp.datastore import Datastore, Metrics
from epp.server.runner import READY_POLL_INTERVAL, Epp
from epp.server.supervisor import TaskFailed
from epp.server.tls import CERT_FILE, KEY_FILE, self_signed
from harness.base.eventually import eventually_async
from harness.cluster import releases
from harness.cluster.builders import PoolBuilder

from .support import LOOPBACK_CONFIG, make_epp, seed_pool

EXPECTED_TASKS = {"controllers", "grpc-ext-proc", "grpc-health", "metrics-http", "debug-http"}


def listening_ports() -> set[int]:
    """Local ports in LISTEN state in this network namespace (/proc/net/tcp and tcp6)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def can_bind(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def epp_ports(epp: Epp) -> list[int]:
    return [epp.grpc_port, epp.health_port, epp.metrics_port, epp.debug_port]


async def assert_fully_stopped(ports: list[int], threads_before: set[threading.Thread]) -> None:
    current = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not current] == []
    assert not set(ports) & listening_ports()
    assert all(can_bind(p) for p in ports)

    async def no_new_threads() -> None:
        # grpc's poller thread lives exactly as long as grpc.aio objects do: it must go too.
        assert {t for t in threading.enumerate() if t.is_alive()} - threads_before == set()

    await eventually_async(no_new_threads)


def test_start_binds_ephemeral_ports_and_stop_leaves_nothing_behind() -> None:
    async def scenario() -> None:
        threads_before = set(threading.enumerate())
        epp = make_epp()
        async with epp:
            await epp.wait_ready()
            ports = epp_ports(epp)
            assert all(p > 0 for p in ports)
            assert len(set(ports)) == 4
            assert set(ports) <= listening_ports()
            assert epp.bind_address == "127.0.0.1"
            assert epp.task_names == EXPECTED_TASKS
        assert epp.task_names == frozenset()
        await assert_fully_stopped(ports, threads_before)

    asyncio.run(scenario())


async def _health(port: int, service: str) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return (await stub.Check(health_pb2.HealthCheckRequest(service=service))).status


def test_health_is_serving_iff_the_pool_is_known_for_any_service_name() -> None:
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

    async def scenario() -> None:
        async with make_epp(seed=None) as epp:
            names = ["", "inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor", "anything"]
            assert [await _health(epp.health_port, n) for n in names] == [not_serving] * 4
            seed_pool(epp.datastore)
            assert [await _health(epp.health_port, n) for n in names] == [serving] * 4
            epp.datastore.clear()  # pool deleted
            assert await _health(epp.health_port, "") == not_serving

    asyncio.run(scenario())


def test_health_watch_is_unimplemented_and_list_names_ext_proc() -> None:
    async def scenario() -> None:
        async with make_epp() as epp:
            await epp.wait_ready()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.health_port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                code = None
                try:
                    async for _ in stub.Watch(health_pb2.HealthCheckRequest()):
                        pass
                except grpc.aio.AioRpcError as err:
                    # Not pytest.raises: a kept exception's traceback would keep the channel alive.
                    code = err.code()
                assert code == grpc.StatusCode.UNIMPLEMENTED
                listed = await stub.List(health_pb2.HealthListRequest())
                assert listed.statuses["envoy.service.ext_proc.v3.ExternalProcessor"].status == (
                    health_pb2.HealthCheckResponse.SERVING
                )

    asyncio.run(scenario())


def test_wait_ready_waits_for_the_pool() -> None:
    async def scenario() -> None:
        async with make_epp(seed=None) as epp:
            ready = asyncio.ensure_future(epp.wait_ready())
            try:
                # A negative check cannot be polled for: give readiness several chances to (wrongly) fire.
                await asyncio.sleep(READY_POLL_INTERVAL * 5)
                assert not ready.done()
                seed_pool(epp.datastore)
                await asyncio.wait_for(ready, timeout=10)
            finally:
                ready.cancel()

    asyncio.run(scenario())


def _seed_with_metrics(store: Datastore) -> None:
    seed_pool(store)
    pod = store.pod_get_all()[0].pod.key
    store.pod_update_metrics_if_exist(
        pod,
        Metrics(
            waiting_queue_size=3,
            running_queue_size=1,
            kv_cache_usage=0.25,
            active_models=frozenset({"lora-b", "lora-a"}),
            max_active_models=4,
            updated_at=90.0,
        ),
    )


def test_debug_view_dumps_the_datastore_read_only() -> None:
    async def scenario() -> None:
        async with make_epp(_seed_with_metrics, clock=lambda: 100.0) as epp:
            await epp.wait_ready()
            from epp.api.types import PodObject
            from harness.cluster.builders import PodBuilder

            epp.datastore.pod_update_or_add(
                PodObject.from_api(PodBuilder("pod-2").labels(app="vllm").ready("10.0.0.2").build())
            )
            pod_1 = next(p.pod.key for p in epp.datastore.pod_get_all() if p.pod.key.name == "pod-1")
            assert epp.datastore.pod_dispatch_started(pod_1, "lora-a", prompt_tokens=120)
            url = f"http://127.0.0.1:{epp.debug_port}/debug/datastore"
            async with aiohttp.ClientSession() as http:
                async with http.get(url) as resp:
                    assert resp.status == 200
                    view = await resp.json()
                for method in ("POST", "PUT", "DELETE", "HEAD"):
                    async with http.request(method, url) as resp:
                        assert resp.status == 405, method
            assert _as_before(view) == {
                "pool": {
                    "namespace": "default",
                    "name": "pool",
                    "selector": {"app": "vllm"},
                    "targetPortNumber": 8000,
                },
                "models": [
                    {
                        "namespace": "default",
                        "name": "m",
                        "modelName": "food-review",
                        "criticality": "Critical",
                        "targetModels": [],
                        "poolRef": {"name": "pool"},
                    }
                ],
                "pods": [
                    {
                        "namespace": "default",
                        "name": "pod-1",
                        "address": "10.0.0.1",
                        "metrics": {
                            "waitingQueueSize": 3,
                            "runningQueueSize": 1,
                            "kvCacheUsagePercent": 0.25,
                            "activeModels": ["lora-a", "lora-b"],
                            "waitingModels": [],
                            "maxActiveModels": 4,
                        },
                        "metricsAgeSeconds": 10.0,
                        "inFlight": 1,
                        "promptTokensInFlight": 120,
                        "prefillTokens": 120,
                    },
                    {
                        "namespace": "default",
                        "name": "pod-2",
                        "address": "10.0.0.2",
                        "metrics": {
                            "waitingQueueSize": 0,
                            "runningQueueSize": 0,
                            "kvCacheUsagePercent": 0.0,
                            "activeModels": [],
                            "waitingModels": [],
                            "maxActiveModels": 0,
                        },
                        "metricsAgeSeconds": None,
                        "inFlight": 0,
                        "promptTokensInFlight": 0,
                        "prefillTokens": 0,
                    },
                ],
                "watches": {},  # the seeding fake watches nothing (the controllers' own tests cover it)
            }
            # What the one datastore shape adds beside those keys (DESIGN.md §1).
            assert {k: view["pool"][k] for k in NEW_POOL_KEYS} == {
                "group": releases.V1ALPHA2.pool_group,
                "targetPorts": [8000],
                "appProtocol": "http",
                "endpointPickerRef": None,
            }
            assert [(p["port"], p["rank"]) for p in view["pods"]] == [(8000, 0), (8000, 0)]
            assert view["objectives"] == []
            assert view["rewrites"] == [
                {
                    "namespace": "default",
                    "name": "m",
                    "created": "1970-01-01T00:00:00+00:00",
                    "poolRef": {
                        "group": releases.V1ALPHA2.pool_group,
                        "kind": "InferencePool",
                        "name": "pool",
                    },
                    "rules": [{"models": ["food-review"], "targets": []}],
                    "impliedPriority": 1,
                }
            ]

    asyncio.run(scenario())


NEW_POOL_KEYS = ("group", "targetPorts", "appProtocol", "endpointPickerRef")
NEW_POD_KEYS = ("port", "rank")
NEW_TOP_KEYS = ("objectives", "rewrites")


def _as_before(view: dict[str, Any]) -> dict[str, Any]:
    """The debug view without the keys added for the v1 generation: exactly what the harness read before."""
    old = {k: v for k, v in view.items() if k not in NEW_TOP_KEYS}
    if old["pool"] is not None:
        old["pool"] = {k: v for k, v in old["pool"].items() if k not in NEW_POOL_KEYS}
    old["pods"] = [{k: v for k, v in p.items() if k not in NEW_POD_KEYS} for p in old["pods"]]
    return old


@pytest.mark.parametrize(
    ("group", "present", "absent"),
    [
        pytest.param(
            V1_POOL_GROUP,
            [
                "# TYPE inference_objective_request_total counter",
                'inference_pool_average_running_requests{name="pool"} 1.0',
                "# TYPE inference_extension_scheduler_e2e_duration_seconds histogram",
                "inference_extension_info{",
            ],
            ["inference_model_"],
            id="v1-upstream-v1.5-names",
        ),
        pytest.param(
            V1ALPHA2_POOL_GROUP,
            ["# TYPE inference_model_request_total counter"],
            ["inference_objective_", "inference_extension_", "inference_pool_average_running_requests"],
            id="v1alpha2-upstream-v0.3-names",
        ),
    ],
)
def test_metrics_endpoint_serves_the_injected_registry(
    group: str, present: list[str], absent: list[str]
) -> None:
    async def scenario() -> None:
        config = dataclasses.replace(LOOPBACK_CONFIG, pool_group=group)
        async with make_epp(_seed_with_metrics, config=config) as epp:
            await epp.wait_ready()
            url = f"http://127.0.0.1:{epp.metrics_port}/metrics"
            async with aiohttp.ClientSession() as http, http.get(url) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain")
                text = await resp.text()
            assert 'inference_pool_ready_pods{name="pool"} 1.0' in text
            assert 'inference_pool_average_queue_size{name="pool"} 3.0' in text
            for line in present:
                assert line in text
            for prefix in absent:
                assert prefix not in text

    asyncio.run(scenario())


def test_registry_is_released_on_stop() -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()

    async def scenario() -> None:
        async with make_epp(registry=registry):
            pass
        async with make_epp(registry=registry):  # would raise DuplicateTimeseries if anything stayed
            pass

    asyncio.run(scenario())
    assert registry.get_sample_value("inference_pool_ready_pods", {"name": "pool"}) is None


async def _route_over_tls(epp: Epp) -> pb.ProcessingResponse:
    assert epp.tls_certificate is not None
    credentials = grpc.ssl_channel_credentials(root_certificates=epp.tls_certificate)
    options = [("grpc.ssl_target_name_override", "localhost")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{epp.grpc_port}", credentials, options=options) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(pb.ProcessingRequest(request_headers=pb.HttpHeaders()))
        await call.read()
        await call.write(
            pb.ProcessingRequest(
                request_body=pb.HttpBody(body=b'{"model":"food-review"}', end_of_stream=True)
            )
        )
        reply = await call.read()
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        assert isinstance(reply, pb.ProcessingResponse)
        assert not reply.HasField("immediate_response"), reply
        return reply


def test_ext_proc_over_tls_with_a_self_signed_certificate() -> None:
    from dataclasses import replace

    async def scenario() -> None:
        async with make_epp(config=replace(LOOPBACK_CONFIG, secure_serving=True)) as epp:
            await epp.wait_ready()
            reply = await _route_over_tls(epp)
            assert (
                reply.dynamic_metadata.fields["envoy.lb"]
                .struct_value.fields["x-gateway-destination-endpoint"]
                .string_value
                == "10.0.0.1:8000"
            )

    asyncio.run(scenario())


def test_cert_path_is_loaded(tmp_path: Path) -> None:
    from dataclasses import replace

    pair = self_signed()
    (tmp_path / CERT_FILE).write_bytes(pair.cert_pem)
    (tmp_path / KEY_FILE).write_bytes(pair.key_pem)

    async def scenario() -> None:
        config = replace(LOOPBACK_CONFIG, secure_serving=True, cert_path=str(tmp_path))
        async with make_epp(config=config) as epp:
            assert epp.tls_certificate == pair.cert_pem
            await _route_over_tls(epp)

    asyncio.run(scenario())


def test_a_dying_task_stops_everything_and_is_surfaced() -> None:
    async def scenario() -> None:
        threads_before = set(threading.enumerate())
        epp = make_epp(fail=RuntimeError("watch exploded"))
        async with epp:
            ports = epp_ports(epp)
            with pytest.raises(TaskFailed) as info:
                await epp.wait()
            assert info.value.name == "controllers"
            assert "watch exploded" in str(info.value)
            with pytest.raises(TaskFailed):
                await epp.wait_ready()
        await assert_fully_stopped(ports, threads_before)

    asyncio.run(scenario())


def test_request_stop_wakes_wait_without_error() -> None:
    async def scenario() -> None:
        async with make_epp() as epp:
            epp.request_stop()
            await epp.wait()

    asyncio.run(scenario())


def test_port_in_use_fails_start_and_rolls_back() -> None:
    from dataclasses import replace

    async def scenario() -> None:
        threads_before = set(threading.enumerate())
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            epp = make_epp(config=replace(LOOPBACK_CONFIG, metrics_port=port))
            with pytest.raises(OSError, match="in use"):
                await epp.start()
            assert epp.task_names == frozenset()
        await assert_fully_stopped([port], threads_before)

    asyncio.run(scenario())


def test_datastore_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not started"):
        _ = make_epp().datastore


def test_pool_builder_round_trip_sanity() -> None:
    # The seed helper builds the pool the EPP serves; a wrong name would make every test above vacuous.
    pool = v1alpha2.pool_from_api(PoolBuilder("pool").selector(app="vllm").port(8000).build())
    assert (pool.key.name, pool.target_port) == (LOOPBACK_CONFIG.pool_name, 8000)
