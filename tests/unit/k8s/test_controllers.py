"""Controllers end to end against the fake API server: informers -> queues -> reconcilers -> datastore.

Also: a failing reconcile is retried, and cancelling `run()` leaves no task behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

import pytest

from epp.api import EndpointKey, InferencePool, NamespacedName, PodObject
from epp.api.types import V1ALPHA2_GROUP
from epp.datastore import Datastore, Metrics, PodMetrics, new_datastore
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.client import KubeClient
from epp.k8s.controllers import Controllers
from harness.base.eventually import eventually_async
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder

from .fake_apiserver import MODEL_PATH, POD_PATH, POOL_PATH, FakeApiServer
from .support import WAIT, BlockingSleep, RecordingSleep, plain_config, run

POOL_KEY = NamespacedName("ns1", "pool")
FAST_RETRY = BackoffPolicy(initial=0.001, maximum=0.001, jitter=0.0)


def pool(name: str = "pool") -> dict[str, object]:
    return PoolBuilder(name).namespace("ns1").selector(app="vllm").port(8000).extension_ref("epp").build()


def pod(name: str, ip: str, ready: bool = True) -> dict[str, object]:
    b = PodBuilder(name).namespace("ns1").labels(app="vllm")
    return (b.ready(ip) if ready else b.unready(ip)).build()


def populate(server: FakeApiServer) -> None:
    server.upsert(POOL_PATH, pool())
    server.upsert(POOL_PATH, pool("someone-elses"))
    server.upsert(MODEL_PATH, ModelBuilder("m1").namespace("ns1").model_name("llama").pool("pool").build())
    server.upsert(MODEL_PATH, ModelBuilder("m2").namespace("ns1").model_name("gemma").pool("other").build())
    server.upsert(POD_PATH, pod("p1", "10.0.0.1"))
    server.upsert(POD_PATH, pod("p2", "10.0.0.2", ready=False))


def pods(store: Datastore) -> dict[str, str]:
    return {pm.pod.key.name: pm.pod.address for pm in store.pod_get_all()}


def models(store: Datastore) -> dict[str, str]:
    return {name: match.rewrite.key.name for name, match in store.rewrite_get_exact().items()}


def test_initial_sync_then_events_flow_to_the_datastore(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="epp.k8s.controllers")

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            populate(server)
            store = new_datastore()
            controllers = Controllers(
                client, store, POOL_KEY, pool_group=V1ALPHA2_GROUP, sleep=RecordingSleep()
            )
            assert not controllers.has_synced
            task = asyncio.create_task(controllers.run(), name="controllers")

            await asyncio.wait_for(controllers.wait_synced(), WAIT)

            # Synced means reconciled, not just listed: the store already shows the initial state.
            assert controllers.has_synced
            said = [r.getMessage() for r in caplog.records if r.name == "epp.k8s.controllers"]
            assert said.count("controllers synced") == 1
            current = store.pool_get()
            assert current is not None
            assert current.key == POOL_KEY
            assert pods(store) == {"p1": "10.0.0.1"}
            assert models(store) == {"llama": "m1"}
            pool_lists = server.lists(POOL_PATH)
            assert pool_lists[0].query["fieldSelector"] == "metadata.name=pool"

            server.upsert(POD_PATH, pod("p2", "10.0.0.2"))
            server.upsert(POD_PATH, pod("p1", "10.0.0.11"))

            async def both_pods() -> None:
                assert pods(store) == {"p1": "10.0.0.11", "p2": "10.0.0.2"}

            await eventually_async(both_pods, timeout=WAIT)

            server.delete(POOL_PATH, "pool")

            async def cleared() -> None:
                assert store.pool_get() is None
                assert pods(store) == {}
                assert models(store) == {}

            await eventually_async(cleared, timeout=WAIT)

            server.upsert(POOL_PATH, pool())

            async def restored() -> None:
                assert pods(store) == {"p1": "10.0.0.11", "p2": "10.0.0.2"}
                assert models(store) == {"llama": "m1"}  # a re-created pool gets its models back

            await eventually_async(restored, timeout=WAIT)

            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            others = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert not [n for n in others if n.startswith("epp-")], others

    run(main)


class FlakyStore:
    """A real datastore whose first `fail` pool_set calls raise, as a transient error would."""

    def __init__(self, fail: int) -> None:
        self.inner = new_datastore()
        self.fail = fail
        self.pool_set_calls = 0

    def pool_set(self, pool: InferencePool) -> None:
        self.pool_set_calls += 1
        if self.pool_set_calls <= self.fail:
            raise RuntimeError("transient")
        self.inner.pool_set(pool)

    def pool_get(self) -> InferencePool | None:
        return self.inner.pool_get()

    def pool_has_synced(self) -> bool:
        return self.inner.pool_has_synced()

    def pool_labels_match(self, labels: dict[str, str]) -> bool:
        return self.inner.pool_labels_match(labels)

    def clear(self) -> None:
        self.inner.clear()

    def __getattr__(self, name: str) -> object:
        # Objectives, rewrites and routing memory: the real store's.
        return getattr(self.inner, name)

    def pod_update_or_add(self, pod: PodObject) -> bool:
        return self.inner.pod_update_or_add(pod)

    def pod_delete(self, key: NamespacedName) -> None:
        self.inner.pod_delete(key)

    def pod_resync(self, pods: Iterable[PodObject]) -> None:
        self.inner.pod_resync(pods)

    def pod_get(self, key: EndpointKey) -> PodMetrics | None:
        return self.inner.pod_get(key)

    def pod_get_all(self) -> Sequence[PodMetrics]:
        return self.inner.pod_get_all()

    def pod_update_metrics_if_exist(self, key: EndpointKey, metrics: Metrics) -> bool:
        return self.inner.pod_update_metrics_if_exist(key, metrics)


def test_failed_reconcile_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            populate(server)
            flaky = FlakyStore(fail=2)
            store: Datastore = flaky
            sleep = RecordingSleep()
            controllers = Controllers(
                client, store, POOL_KEY, pool_group=V1ALPHA2_GROUP, retry_backoff=FAST_RETRY, sleep=sleep
            )
            task = asyncio.create_task(controllers.run(), name="controllers")

            async def pool_known() -> None:
                assert store.pool_get() is not None
                assert pods(store) == {"p1": "10.0.0.1"}

            await eventually_async(pool_known, timeout=WAIT)
            assert flaky.pool_set_calls == 3

            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    with caplog.at_level("ERROR", logger="epp.k8s.controllers"):
        run(main)
    # Each failure is logged with its traceback, the kind, the key and how many times it failed.
    failures = [r for r in caplog.records if r.name == "epp.k8s.controllers"]
    assert [r.getMessage() for r in failures] == [
        "pool reconcile of ns1/pool failed (attempt 1); will retry",
        "pool reconcile of ns1/pool failed (attempt 2); will retry",
    ]
    assert all(r.exc_info is not None for r in failures)


def test_the_settings_reach_every_kind_and_each_runs_under_its_own_task_name() -> None:
    """The reconnect backoff, bookmark interval and scope given to Controllers are what each
    informer uses; a task dump (py-spy, aiomonitor) names each informer and worker by its kind."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            populate(server)
            server.list_faults.extend(["500"] * 3)
            sleep = RecordingSleep()
            controllers = Controllers(
                client,
                new_datastore(),
                POOL_KEY,
                pool_group=V1ALPHA2_GROUP,
                sleep=sleep,
                reconnect_backoff=BackoffPolicy(initial=0.3, maximum=0.3, jitter=0.0),
                bookmark_interval=40.0,
            )
            task = asyncio.create_task(controllers.run(), name="controllers")
            await asyncio.wait_for(controllers.wait_synced(), WAIT)
            assert sleep.delays == [0.3, 0.3, 0.3]  # each kind's first list failed once
            names = {t.get_name() for t in asyncio.all_tasks()} - {"controllers", "Task-1"}
            assert {n for n in names if n.startswith("epp-")} == {
                f"epp-{role}-{kind}"
                for role in ("informer", "worker")
                for kind in ("pool", "rewrite", "pod")  # InferenceModel is a rewrite
            }

            async def all_watching() -> None:
                watched = {r.path for r in server.requests if r.verb == "watch"}
                assert watched == {POOL_PATH, MODEL_PATH, POD_PATH}

            await eventually_async(all_watching, timeout=WAIT)
            for request in server.requests:
                assert request.query.get("fieldSelector") == (
                    "metadata.name=pool" if request.path == POOL_PATH else None
                )
                if request.verb == "watch":
                    assert 40 <= int(request.query["timeoutSeconds"]) <= 50
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(main)


def test_cancel_before_sync_leaves_nothing_running() -> None:
    """Every informer is stuck in its list backoff; cancelling must still stop everything."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.list_faults.extend(["500"] * 3)
            sleep = BlockingSleep()
            controllers = Controllers(
                client, new_datastore(), POOL_KEY, pool_group=V1ALPHA2_GROUP, sleep=sleep
            )
            task = asyncio.create_task(controllers.run(), name="controllers")

            async def retried() -> None:
                assert len(sleep.delays) == 3

            await eventually_async(retried, timeout=WAIT)
            # Nothing listed yet: no version received, none applied.
            assert {
                (p.received_resource_version, p.applied_resource_version) for p in controllers.progress()
            } == {("", "")}
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not controllers.has_synced

    run(main)


def test_run_twice_is_refused() -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            controllers = Controllers(
                client, new_datastore(), POOL_KEY, pool_group=V1ALPHA2_GROUP, sleep=RecordingSleep()
            )
            task = asyncio.create_task(controllers.run(), name="controllers")
            await asyncio.wait_for(controllers.wait_synced(), WAIT)
            with pytest.raises(RuntimeError, match=r"^Controllers\.run\(\) may be called only once$"):
                await controllers.run()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(main)
