"""The v1 generation's optional kinds against the fake API server: InferenceObjective and
InferenceModelRewrite may be absent (no CRD: 404) or forbidden (RBAC: 403). The EPP then serves without
them and logs one warning (upstream #1737 crash-looped; istio.io #17528 went unhealthy), and picks up a
CRD installed (or a permission granted) after start without a restart (upstream looks only at start-up).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from epp.api import NamespacedName, v1
from epp.api.types import V1_GROUP, V1ALPHA2_GROUP
from epp.datastore import Datastore, new_datastore
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.client import KubeClient, Resource
from epp.k8s.controllers import Controllers
from epp.k8s.informer import Informer
from harness.base.eventually import eventually_async
from harness.cluster.builders import PodBuilder
from tests.unit.api import objects

from .fake_apiserver import MODEL_PATH, OBJECTIVE_PATH, POD_PATH, REWRITE_PATH, V1_POOL_PATH, FakeApiServer
from .support import WAIT, RecordingSleep, plain_config, run

POOL_KEY = NamespacedName("ns1", "pool")
NO_WAIT = BackoffPolicy(initial=0.0, maximum=0.0, jitter=0.0)
RECONNECT = BackoffPolicy(initial=0.01, maximum=0.01, jitter=0.0)
INFORMER_LOG = "epp.k8s.informer"


def populate(server: FakeApiServer) -> None:
    server.upsert(V1_POOL_PATH, objects.pool_v1(ports=(8000, 8001)))
    server.upsert(POD_PATH, PodBuilder("p1").namespace("ns1").labels(app="vllm").ready("10.0.0.1").build())


def endpoints(store: Datastore) -> list[str]:
    return sorted(pm.pod.endpoint for pm in store.pod_get_all())


def availability(controllers: Controllers) -> dict[str, bool]:
    return {w.resource: w.available for w in controllers.progress() if w.optional}


async def with_controllers(
    server: FakeApiServer, check: Callable[[Controllers, Datastore], Awaitable[None]]
) -> None:
    async with KubeClient(plain_config(server.url)) as client:
        store = new_datastore()
        controllers = Controllers(
            client, store, POOL_KEY, sleep=RecordingSleep(), pool_group=V1_GROUP, absent_backoff=NO_WAIT
        )
        task = asyncio.create_task(controllers.run(), name="controllers")
        try:
            await asyncio.wait_for(controllers.wait_synced(), WAIT)
            await check(controllers, store)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


def warnings_about(caplog: pytest.LogCaptureFixture, plural: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == INFORMER_LOG
        and r.levelno == logging.WARNING
        and plural in r.getMessage()
        and "serving without it" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("absent", "forbidden"),
    [
        pytest.param({OBJECTIVE_PATH, REWRITE_PATH}, set(), id="crds-absent"),
        pytest.param(set(), {OBJECTIVE_PATH, REWRITE_PATH}, id="rbac-forbids"),
        pytest.param({OBJECTIVE_PATH}, {REWRITE_PATH}, id="one-absent-one-forbidden"),
    ],
)
def test_serves_without_the_optional_kinds_and_warns_once(
    caplog: pytest.LogCaptureFixture, absent: set[str], forbidden: set[str]
) -> None:
    caplog.set_level(logging.INFO, logger=INFORMER_LOG)

    async def main() -> None:
        async with FakeApiServer() as server:
            populate(server)
            server.absent |= absent
            server.forbidden |= forbidden

            async def check(controllers: Controllers, store: Datastore) -> None:
                assert controllers.has_synced
                assert store.pool_get() is not None
                assert endpoints(store) == ["10.0.0.1:8000", "10.0.0.1:8001"]
                assert availability(controllers) == {
                    "inferenceobjectives": False,
                    "inferencemodelrewrites": False,
                }

                async def retried_a_few_times() -> None:
                    assert len(server.lists(OBJECTIVE_PATH)) >= 5
                    assert len(server.lists(REWRITE_PATH)) >= 5

                await eventually_async(retried_a_few_times, timeout=WAIT)

            await with_controllers(server, check)

    run(main)
    # One warning per kind, however often it was looked for.
    assert len(warnings_about(caplog, "inferenceobjectives")) == 1
    assert len(warnings_about(caplog, "inferencemodelrewrites")) == 1


def test_a_crd_installed_after_start_is_picked_up_and_one_removed_is_forgotten(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=INFORMER_LOG)

    async def main() -> None:
        async with FakeApiServer() as server:
            populate(server)
            server.absent |= {OBJECTIVE_PATH, REWRITE_PATH}

            async def check(controllers: Controllers, store: Datastore) -> None:
                assert store.objective_get("chat") is None
                # The CRDs are installed and objects created: no restart.
                server.absent.clear()
                server.upsert(OBJECTIVE_PATH, objects.objective("chat", 7))
                server.upsert(
                    REWRITE_PATH, objects.rewrite("r", objects.rule("llama", targets=[("llama-v2", 1)]))
                )

                async def picked_up() -> None:
                    chat = store.objective_get("chat")
                    assert chat is not None
                    assert chat.effective_priority == 7
                    match = store.rewrite_match("llama")
                    assert match is not None
                    assert match.rule.targets[0].name == "llama-v2"
                    assert availability(controllers) == {
                        "inferenceobjectives": True,
                        "inferencemodelrewrites": True,
                    }

                await eventually_async(picked_up, timeout=WAIT)
                # Then the objective CRD is deleted (its objects with it): the watch fails, the kind is
                # served without again and what it held is gone.
                server.absent.add(OBJECTIVE_PATH)
                server.compact(OBJECTIVE_PATH)  # ends the open watch, as the CRD's removal does

                async def forgotten() -> None:
                    assert store.objective_get("chat") is None
                    assert availability(controllers)["inferenceobjectives"] is False

                await eventually_async(forgotten, timeout=WAIT)
                assert store.rewrite_match("llama") is not None  # the other kind is untouched

            await with_controllers(server, check)

    run(main)
    assert len(warnings_about(caplog, "inferenceobjectives")) == 2  # one per outage
    assert len(warnings_about(caplog, "inferencemodelrewrites")) == 1


def test_v1alpha2_inference_models_stay_required() -> None:
    """v0.3.0 behaviour: without the InferenceModel CRD the EPP never syncs (it retries the list)."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.absent.add(MODEL_PATH)
            sleep = RecordingSleep()
            controllers = Controllers(
                client, new_datastore(), POOL_KEY, sleep=sleep, pool_group=V1ALPHA2_GROUP
            )
            task = asyncio.create_task(controllers.run(), name="controllers")

            async def retried() -> None:
                assert len(server.lists(MODEL_PATH)) >= 3

            await eventually_async(retried, timeout=WAIT)
            assert not controllers.has_synced
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(main)


def objectives_informer(client: KubeClient, sleep: RecordingSleep) -> Informer[object]:
    """An informer of the optional InferenceObjectives, looking for them 1, 2, 4, then every 8 s
    while absent, reconnecting after 0.01 s (``RECONNECT``), every delay recorded, none waited."""
    return Informer(
        client,
        Resource(v1.OPTIONAL_GROUP, v1.OPTIONAL_VERSION, v1.OBJECTIVES),
        "ns1",
        lambda raw: raw,
        sleep=sleep,
        optional=True,
        absent_backoff=BackoffPolicy(initial=1.0, maximum=8.0, factor=2.0, jitter=0.0),
        backoff=RECONNECT,
    )


@pytest.mark.parametrize(
    ("status", "says"),
    [
        pytest.param(
            404,
            "inferenceobjectives/ns1: not served (no CRD?): 404 NotFound: the server could not find the "
            "requested resource; serving without it, and looking again every 8s at most",
            id="no-crd",
        ),
        pytest.param(
            403,
            'inferenceobjectives/ns1: forbidden (RBAC?): 403 Forbidden: pods is forbidden: User "x" cannot '
            "list; serving without it, and looking again every 8s at most",
            id="rbac",
        ),
    ],
)
def test_an_absent_kind_says_why_and_is_looked_for_again_ever_less_often(
    caplog: pytest.LogCaptureFixture, status: int, says: str
) -> None:
    """The warning names the likely cause (a missing CRD or RBAC rule) and the longest wait; the
    looks back off from the policy's first delay to its cap, and the kind counts as synced, empty,
    at no resourceVersion."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            (server.absent if status == 404 else server.forbidden).add(OBJECTIVE_PATH)
            sleep = RecordingSleep()
            informer = objectives_informer(client, sleep)
            task = asyncio.create_task(informer.run(), name="objectives")

            async def looked_six_times() -> None:
                assert len(sleep.delays) >= 6

            await eventually_async(looked_six_times, timeout=WAIT)
            assert sleep.delays[:6] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
            assert (informer.has_synced, informer.available, informer.objects()) == (True, False, ())
            assert informer.resource_version == ""
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    with caplog.at_level(logging.WARNING, logger=INFORMER_LOG):
        run(main)
    assert [r.getMessage() for r in caplog.records] == [says]


def test_a_kind_served_again_starts_its_next_outage_from_the_first_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Installed, then removed again: the looks back off from the first delay anew, and the log says
    when the kind is served."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.absent.add(OBJECTIVE_PATH)
            sleep = RecordingSleep()
            informer = objectives_informer(client, sleep)
            task = asyncio.create_task(informer.run(), name="objectives")

            async def looked(n: int) -> None:
                assert len(sleep.delays) >= n

            await eventually_async(lambda: looked(3), timeout=WAIT)
            server.absent.clear()

            async def served() -> None:
                assert informer.available
                assert len(server.watches(OBJECTIVE_PATH)) >= 1

            await eventually_async(served, timeout=WAIT)
            seen = len(sleep.delays)
            server.absent.add(OBJECTIVE_PATH)
            server.compact(OBJECTIVE_PATH)  # ends the watch, as the CRD's removal does
            await eventually_async(lambda: looked(seen + 3), timeout=WAIT)
            # (A watch ended at once may first back off as a reconnect, 0.01 s here.)
            assert [d for d in sleep.delays[seen:] if d != RECONNECT.initial][:2] == [1.0, 2.0]
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    with caplog.at_level(logging.INFO, logger=INFORMER_LOG):
        run(main)
    assert "inferenceobjectives/ns1: now served; watching it" in [r.getMessage() for r in caplog.records]
