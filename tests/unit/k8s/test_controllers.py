"""Controllers end to end against the fake API server: informers -> queues -> reconcilers -> datastore.

Also: a failing reconcile is retried, and cancelling `run()` leaves no task behind.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from epp.api import EndpointKey, InferencePool, NamespacedName, ObjectReader, PodObject
from epp.api.types import V1_GROUP, V1ALPHA2_GROUP
from epp.datastore import Datastore, PodMetrics, new_datastore
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.client import KubeClient
from epp.k8s.controllers import Controllers, Reconcile, ReconcilerFactory, Reconcilers
from harness.base.eventually import eventually_async
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder
from tests.unit.api import objects

from .fake_apiserver import MODEL_PATH, OBJECTIVE_PATH, POD_PATH, POOL_PATH, V1_POOL_PATH, FakeApiServer
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

    def __getattr__(self, name: str) -> Any:
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


@dataclass(frozen=True)
class RecordingBackoff(BackoffPolicy):
    """A real policy that also records the random source each of its delays was drawn from."""

    drawn_from: list[random.Random] = field(default_factory=list, compare=False)

    def delay(self, attempt: int, rng: random.Random) -> float:
        self.drawn_from.append(rng)
        return super().delay(attempt, rng)


def test_the_given_backoffs_are_used_and_every_delay_is_drawn_from_the_given_random_source() -> None:
    """Each policy given to Controllers is the one used where it belongs (reconnects, retries of a
    failed reconcile, looking again for an absent kind), and every jittered delay is drawn from the
    one random source given: a seeded source makes a run's timing reproducible."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.upsert(V1_POOL_PATH, objects.pool_v1())
            server.upsert(POD_PATH, pod("p1", "10.0.0.1"))
            server.forbidden.add(OBJECTIVE_PATH)  # absent: looked for again with absent_backoff
            server.list_faults.extend(["500"] * 4)  # reconnect_backoff
            flaky = FlakyStore(fail=1)  # the pool's first reconcile fails: retry_backoff
            store: Datastore = flaky
            rng = random.Random(3)
            reconnect = RecordingBackoff(initial=0.01, maximum=0.01, jitter=0.5)
            retry = RecordingBackoff(initial=0.001, maximum=0.001, jitter=0.5)
            absent = RecordingBackoff(initial=0.01, maximum=0.01, jitter=0.5)
            controllers = Controllers(
                client,
                store,
                POOL_KEY,
                pool_group=V1_GROUP,
                sleep=RecordingSleep(),
                rng=rng,
                reconnect_backoff=reconnect,
                retry_backoff=retry,
                absent_backoff=absent,
            )
            task = asyncio.create_task(controllers.run(), name="controllers")

            async def each_used() -> None:
                assert reconnect.drawn_from, "reconnect_backoff never used"
                assert retry.drawn_from, "retry_backoff never used"
                assert absent.drawn_from, "absent_backoff never used"
                assert flaky.pool_get() is not None

            await eventually_async(each_used, timeout=WAIT)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            policies = {"reconnect_backoff": reconnect, "retry_backoff": retry, "absent_backoff": absent}
            for name, policy in policies.items():
                foreign = [source for source in policy.drawn_from if source is not rng]
                assert not foreign, f"{name}: {len(foreign)} delays drawn from another random source"

    run(main)


def test_every_reconciler_factory_is_given_the_reader_the_store_and_the_pool_served() -> None:
    """`Reconcilers` is how a harness plants a slow or broken reconcile: each kind's factory, the
    pod's too, gets the same reader, the store and the pool this EPP serves."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            given: dict[str, tuple[ObjectReader, Datastore, NamespacedName]] = {}

            def factory(kind: str) -> ReconcilerFactory:
                def build(reader: ObjectReader, store: Datastore, pool: NamespacedName) -> Reconcile:
                    given[kind] = (reader, store, pool)
                    return lambda key: None

                return build

            store = new_datastore()
            kinds = ("pool", "objective", "rewrite", "pod")
            Controllers(
                client,
                store,
                POOL_KEY,
                pool_group=V1_GROUP,
                sleep=RecordingSleep(),
                reconcilers=Reconcilers(**{kind: factory(kind) for kind in kinds}),
            )
            assert set(given) == set(kinds)
            assert {(s, p) for _, s, p in given.values()} == {(store, POOL_KEY)}
            assert len({id(reader) for reader, _, _ in given.values()}) == 1

    run(main)
