"""Informer against the fake API server: list+watch, cache-before-handler, bookmarks, 410 relist with
synthesized deletes, reconnect with backoff after a dropped connection, list retries."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from epp.api import NamespacedName, PodObject
from epp.k8s.backoff import BackoffPolicy
from epp.k8s.client import PODS, KubeClient
from epp.k8s.informer import DEFAULT_RECONNECT_BACKOFF, Informer, InformerEvent
from harness.base.eventually import eventually_async
from harness.cluster.builders import PodBuilder

from .fake_apiserver import POD_PATH, FakeApiServer
from .support import WAIT, RecordingSleep, plain_config, run

NO_JITTER = BackoffPolicy(initial=0.5, maximum=4.0, factor=2.0, jitter=0.0)


def key(name: str) -> NamespacedName:
    return NamespacedName("ns1", name)


def pod(name: str, ip: str = "10.0.0.1") -> dict[str, object]:
    return PodBuilder(name).namespace("ns1").labels(app="vllm").ready(ip).build()


class SteppingClock:
    """Each reading is `step` seconds after the previous one (0: time stands still)."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class Harness:
    """An informer for ns1 pods, its recorded events and injected sleep and clock.

    By default every watch looks long-lived (the clock steps 10 s per reading), so only real failures
    back off; a test about "very short" watches stops the clock.
    """

    def __init__(
        self,
        server: FakeApiServer,
        client: KubeClient,
        clock_step: float,
        bookmark_interval: float = 60.0,
        first_handler: Callable[[InformerEvent[PodObject]], None] | None = None,
    ) -> None:
        self.server = server
        self.sleep = RecordingSleep()
        self.informer: Informer[PodObject] = Informer(
            client,
            PODS,
            "ns1",
            PodObject.from_api,
            backoff=NO_JITTER,
            sleep=self.sleep,
            clock=SteppingClock(clock_step),
            bookmark_interval=bookmark_interval,
            rng=random.Random(7),
        )
        self.events: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.cache_at_event: list[bool] = []
        if first_handler is not None:
            self.informer.add_handler(first_handler)
        self.informer.add_handler(self._record)

    def _record(self, event: InformerEvent[PodObject]) -> None:
        # The cache must already reflect the event when handlers run.
        cached = self.informer.get(event.key)
        self.cache_at_event.append(cached is None if event.type == "DELETED" else cached == event.obj)
        self.events.put_nowait((event.type, event.key.name))

    async def next(self, n: int = 1) -> list[tuple[str, str]]:
        return [await asyncio.wait_for(self.events.get(), WAIT) for _ in range(n)]

    async def watch_count(self, n: int) -> None:
        """Until the server has seen `n` watch requests (the informer is (re)connected)."""

        async def reached() -> None:
            assert len(self.server.watches(POD_PATH)) >= n

        await eventually_async(reached, timeout=WAIT)


@asynccontextmanager
async def started(
    setup: Callable[[FakeApiServer], None] = lambda s: None,
    clock_step: float = 10.0,
    bookmark_interval: float = 60.0,
    first_handler: Callable[[InformerEvent[PodObject]], None] | None = None,
) -> AsyncIterator[Harness]:
    async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
        setup(server)
        h = Harness(server, client, clock_step, bookmark_interval, first_handler)
        task = asyncio.create_task(h.informer.run(), name="test-informer")
        try:
            yield h
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


def unparseable(name: str) -> dict[str, object]:
    """A pod the parser refuses (labels that are not a map)."""
    broken = pod(name)
    broken["metadata"]["labels"] = "not-a-map"  # type: ignore[index]
    return broken


def two_pods(server: FakeApiServer) -> None:
    server.upsert(POD_PATH, pod("p1"))
    server.upsert(POD_PATH, pod("p2"))


def test_list_then_watch_keeps_the_cache_and_tells_handlers_after_updating_it() -> None:
    async def main() -> None:
        async with started(two_pods) as h:
            await asyncio.wait_for(h.informer.wait_synced(), WAIT)
            assert sorted(await h.next(2)) == [("ADDED", "p1"), ("ADDED", "p2")]
            await h.watch_count(1)

            h.server.upsert(POD_PATH, pod("p3", "10.0.0.3"))
            h.server.upsert(POD_PATH, pod("p1", "10.0.0.9"))
            h.server.delete(POD_PATH, "p2")

            assert await h.next(3) == [("ADDED", "p3"), ("MODIFIED", "p1"), ("DELETED", "p2")]
            assert sorted(p.key.name for p in h.informer.objects()) == ["p1", "p3"]
            cached = h.informer.get(key("p1"))
            assert cached is not None
            assert cached.pod_ip == "10.0.0.9"
            assert all(h.cache_at_event)
            assert h.informer.resource_version == str(h.server.rv)
            assert h.sleep.delays == []

    run(main)


def test_watch_starts_from_the_list_resource_version() -> None:
    async def main() -> None:
        async with started(two_pods) as h:
            await h.watch_count(1)
            listed_rv = str(h.server.rv)
            assert h.server.watches(POD_PATH)[0].query["resourceVersion"] == listed_rv

    run(main)


def test_bookmark_advances_the_resource_version_used_to_reconnect() -> None:
    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            two_pods(server)
            server.watch_faults.append("drop:1")  # the first watch dies right after one event

        async with started(setup) as h:
            await h.next(2)
            mark = h.server.bookmark(POD_PATH)  # that one event: nothing changed, only the version
            await h.watch_count(2)

            assert h.server.watches(POD_PATH)[1].query["resourceVersion"] == str(mark)
            assert h.informer.resource_version == str(mark)
            assert h.events.empty()  # a bookmark is not a change
            h.server.upsert(POD_PATH, pod("p3"))
            assert await h.next() == [("ADDED", "p3")]

    run(main)


def test_reconnect_after_dropped_connection_resumes_without_relisting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The drop is a failure to back off from (once, at the initial delay), and the warning says why."""

    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            two_pods(server)
            server.watch_faults.append("drop:1")

        async with started(setup) as h:
            await h.next(2)
            h.server.upsert(POD_PATH, pod("p3"))
            assert await h.next() == [("ADDED", "p3")]  # delivered, then the connection drops
            await h.watch_count(2)
            resumed_from = h.server.watches(POD_PATH)[1].query["resourceVersion"]
            h.server.upsert(POD_PATH, pod("p4"))

            assert await h.next() == [("ADDED", "p4")]
            assert resumed_from == h.server.collections[POD_PATH].objects["p3"]["metadata"]["resourceVersion"]
            assert len(h.server.lists(POD_PATH)) == 1
            assert h.sleep.delays == [0.5]  # one backoff at the initial delay (events reset it)

    with caplog.at_level("WARNING", logger="epp.k8s.informer"):
        run(main)
    (warning,) = [r.getMessage() for r in caplog.records]
    dropped = (
        r"pods/ns1: watch failed: watch http://\S+/api/v1/namespaces/ns1/pods: .+; "
        r"retrying in 0\.50s \(failure 1\)"
    )
    assert re.fullmatch(dropped, warning), warning


@pytest.mark.parametrize(
    "as_event", [pytest.param(False, id="http-410"), pytest.param(True, id="error-event-410")]
)
def test_gone_relists_and_synthesizes_deletes(as_event: bool) -> None:
    async def main() -> None:
        async with started(two_pods) as h:
            h.server.gone_as_event(as_event)
            await h.next(2)
            await h.watch_count(1)
            # While the informer is "away", changes happen whose events it will never see.
            h.server.delete(POD_PATH, "p1", record=False)
            h.server.upsert(POD_PATH, pod("p2", "10.0.0.22"), record=False)
            h.server.upsert(POD_PATH, pod("p5"), record=False)
            h.server.compact(POD_PATH)

            got = sorted(await h.next(3))

            assert got == [("ADDED", "p5"), ("DELETED", "p1"), ("MODIFIED", "p2")]
            assert len(h.server.lists(POD_PATH)) == 2
            assert sorted(p.key.name for p in h.informer.objects()) == ["p2", "p5"]
            assert all(h.cache_at_event)
            assert h.sleep.delays == []  # a relist is not a failure
            assert h.informer.relists == 1

    run(main)


def test_relist_reports_nothing_for_unchanged_objects() -> None:
    async def main() -> None:
        async with started(two_pods) as h:
            await h.next(2)
            await h.watch_count(1)
            h.server.compact(POD_PATH)
            await h.watch_count(2)  # the 410 answer
            h.server.upsert(POD_PATH, pod("p3"))
            assert await h.next() == [("ADDED", "p3")]  # no MODIFIED for p1/p2 came first

    run(main)


def test_list_failures_back_off_exponentially_until_synced() -> None:
    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            two_pods(server)
            server.list_faults.extend(["500", "403", "500"])

        async with started(setup) as h:
            await asyncio.wait_for(h.informer.wait_synced(), WAIT)
            assert h.sleep.delays == [0.5, 1.0, 2.0]
            assert len(h.server.lists(POD_PATH)) == 4
            assert sorted(await h.next(2)) == [("ADDED", "p1"), ("ADDED", "p2")]

    run(main)


def test_watch_that_closes_at_once_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    """client-go's "very short watch": a watch ending immediately with nothing is a failure, and the
    log says that is why the informer waits (not an error the server sent)."""

    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            server.watch_faults.extend(["close", "close", "500"])

        async with started(setup, clock_step=0.0) as h:
            await h.watch_count(4)
            assert h.sleep.delays == [0.5, 1.0, 2.0]

    with caplog.at_level("DEBUG", logger="epp.k8s.informer"):
        run(main)
    assert [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()] == [
        "pods/ns1: watch closed at once without events; retrying in 0.50s (failure 1)",
        "pods/ns1: watch closed at once without events; retrying in 1.00s (failure 2)",
        "pods/ns1: watch failed: 500 InternalError: scripted failure; retrying in 2.00s (failure 3)",
    ]


def test_unparseable_object_is_not_cached() -> None:
    async def main() -> None:
        async with started(two_pods) as h:
            await h.next(2)
            await h.watch_count(1)
            h.server.upsert(POD_PATH, unparseable("p1"))
            assert await h.next() == [("DELETED", "p1")]
            assert h.informer.get(key("p1")) is None

    run(main)


def test_resource_version_is_recorded_only_after_the_handlers_ran() -> None:
    """Whoever reads version X must find every handler up to X already called (the settle barrier)."""

    async def main() -> None:
        async with started(two_pods) as h:
            seen_by_handler: list[str] = []
            h.informer.add_handler(lambda _: seen_by_handler.append(h.informer.resource_version))
            await asyncio.wait_for(h.informer.wait_synced(), WAIT)
            listed = h.informer.resource_version
            assert seen_by_handler == ["", ""], "the list's version is recorded after its events"
            await h.next(2)
            await h.watch_count(1)

            h.server.upsert(POD_PATH, pod("p3"))
            await h.next()
            assert seen_by_handler[-1] == listed  # the handler ran before the new version was recorded
            assert h.informer.resource_version == str(h.server.rv)

    run(main)


def test_each_watch_asks_the_server_to_end_it_within_a_quarter_more_than_the_interval() -> None:
    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            server.watch_faults.extend(["close"] * 5)

        async with started(setup, bookmark_interval=60.0) as h:
            await h.watch_count(6)
            timeouts = [int(r.query["timeoutSeconds"]) for r in h.server.watches(POD_PATH)]
            assert all(60 <= t <= 75 for t in timeouts), timeouts
            assert len(set(timeouts)) > 1, "spread, so replicas do not renew their watches in step"

    run(main)


def test_a_watch_silent_for_two_intervals_is_replaced_at_once_and_resumes() -> None:
    """A half-open connection: headers came, then nothing. Two intervals later the watch is replaced,
    from the same resourceVersion, without backoff (the server is not to blame) and without a relist."""

    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            two_pods(server)
            server.watch_faults.append("hang")

        async with started(setup, bookmark_interval=0.2) as h:  # idle limit 0.4 s
            await h.next(2)
            await h.watch_count(2)
            first, second = h.server.watches(POD_PATH)[:2]
            assert second.query["resourceVersion"] == first.query["resourceVersion"]
            assert h.informer.stalled_watches == 1
            h.server.upsert(POD_PATH, pod("p3"))

            assert await h.next() == [("ADDED", "p3")]
            assert h.sleep.delays == []
            assert len(h.server.lists(POD_PATH)) == 1

    run(main)


def test_while_the_api_is_away_retries_come_at_least_every_two_seconds() -> None:
    """So a watch resumes within about 2 s of the API server coming back, however long it was away."""
    rng = random.Random(1)
    delays = [DEFAULT_RECONNECT_BACKOFF.delay(attempt, rng) for attempt in range(64)]
    assert max(delays) <= 2.0
    assert delays[0] < 0.5, "the first retry is quick"


def test_an_event_of_an_unknown_type_is_skipped_but_moves_the_version_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A newer server's event type (or a proxy's mangling) must neither stop the watch nor change
    the cache; the watch still resumes after it."""

    async def main() -> None:
        async with started(two_pods) as h:
            await h.next(2)
            await h.watch_count(1)
            h.server.raw_event(POD_PATH, "PATCHED", pod("p1", "10.9.9.9"))
            h.server.upsert(POD_PATH, pod("p3"))
            assert await h.next() == [("ADDED", "p3")]
            cached = h.informer.get(key("p1"))
            assert cached is not None
            assert cached.pod_ip == "10.0.0.1"
            assert h.informer.resource_version == str(h.server.rv)

    with caplog.at_level("WARNING", logger="epp.k8s.informer"):
        run(main)
    assert [r.getMessage() for r in caplog.records] == ["pods/ns1: ignoring watch event of type 'PATCHED'"]


def test_a_failing_handler_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        def broken(event: InformerEvent[PodObject]) -> None:
            raise RuntimeError("handler bug")

        async with started(two_pods, first_handler=broken) as h:  # runs before the recording handler
            assert sorted(await h.next(2)) == [("ADDED", "p1"), ("ADDED", "p2")]

    with caplog.at_level("ERROR", logger="epp.k8s.informer"):
        run(main)
    failures = sorted(r.getMessage() for r in caplog.records)
    assert failures == [
        "pods/ns1: handler failed for ADDED ns1/p1",
        "pods/ns1: handler failed for ADDED ns1/p2",
    ]
    assert all(r.exc_info is not None for r in caplog.records)


def test_an_unparseable_object_never_cached_makes_no_event(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing was routable under that name, so there is nothing to delete: no event at all."""

    async def main() -> None:
        async with started(two_pods) as h:
            await h.next(2)
            await h.watch_count(1)
            h.server.upsert(POD_PATH, unparseable("p9"))
            h.server.upsert(POD_PATH, pod("p3"))
            assert await h.next() == [("ADDED", "p3")]
            assert h.informer.get(key("p9")) is None

    with caplog.at_level("WARNING", logger="epp.k8s.informer"):
        run(main)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"pods/ns1: cannot parse ns1/p9: (KeyError|ValueError|TypeError)\(.+\)", warning)


def test_the_deletion_of_an_unparseable_object_never_cached_makes_no_event() -> None:
    """A deletion is told with the object's last state; one the cache never held and that cannot be
    parsed has none, so handlers hear nothing (they would otherwise get a deletion without an object)."""

    async def main() -> None:
        async with started(two_pods) as h:
            await h.next(2)
            await h.watch_count(1)
            h.server.raw_event(POD_PATH, "DELETED", unparseable("p9"))
            h.server.upsert(POD_PATH, pod("p3"))
            assert await h.next() == [("ADDED", "p3")]
            assert h.informer.get(key("p9")) is None

    run(main)


def test_an_object_without_a_namespace_is_keyed_as_its_parser_keys_it() -> None:
    """The cache's key and the parsed object's own key must agree, namespace "" included: a reconciler
    given the event's key reads the cache and writes the store under the object's key, so a
    mismatch would leave the object in the store after its deletion."""

    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            bare = pod("p0")
            del bare["metadata"]["namespace"]  # type: ignore[attr-defined]
            server.upsert(POD_PATH, bare)

        seen: list[InformerEvent[PodObject]] = []
        async with started(setup, first_handler=seen.append) as h:
            assert await h.next() == [("ADDED", "p0")]
            [event] = seen
            assert event.key == event.obj.key == NamespacedName("", "p0")
            assert h.informer.get(NamespacedName("", "p0")) == event.obj

    run(main)


def test_while_the_api_is_away_the_first_and_every_tenth_failure_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            server.list_faults.extend(["500"] * 21)

        async with started(setup) as h:
            await asyncio.wait_for(h.informer.wait_synced(), WAIT)

    with caplog.at_level("DEBUG", logger="epp.k8s.informer"):
        run(main)
    failures = [r for r in caplog.records if "list failed" in r.getMessage()]
    assert len(failures) == 21
    assert [i + 1 for i, r in enumerate(failures) if r.levelname == "WARNING"] == [1, 11, 21]
    assert failures[10].getMessage() == (
        "pods/ns1: list failed: 500 InternalError: scripted failure; retrying in 4.00s (failure 11)"
    )


def test_a_deletion_is_told_with_the_object_s_last_state_even_one_never_cached() -> None:
    """Handlers get every deletion, with the object as the server last had it: also one the cache
    never held (created and deleted between a list and the next watch), which a reconciler may hold
    from before."""

    async def main() -> None:
        seen: list[InformerEvent[PodObject]] = []
        async with started(two_pods, first_handler=seen.append) as h:
            await h.next(2)
            await h.watch_count(1)
            h.server.raw_event(POD_PATH, "DELETED", pod("p9", "10.0.0.9"))
            h.server.delete(POD_PATH, "p1")
            assert await h.next(2) == [("DELETED", "p9"), ("DELETED", "p1")]
            h.server.upsert(POD_PATH, pod("p2", "10.0.0.2"))
            assert await h.next() == [("MODIFIED", "p2")]
            h.server.delete(POD_PATH, "p2", record=False)  # missed: found out by the relist after 410
            h.server.compact(POD_PATH)
            assert await h.next() == [("DELETED", "p2")]
        deleted = {e.key.name: e.obj for e in seen if e.type == "DELETED"}
        assert deleted["p9"].pod_ip == "10.0.0.9"
        assert deleted["p1"].pod_ip == "10.0.0.1"
        assert deleted["p2"].pod_ip == "10.0.0.2"  # the last state the cache held

    run(main)


@pytest.mark.parametrize(
    ("lasted", "backs_off"),
    [pytest.param(0.4, True, id="under-half-its-timeout"), pytest.param(0.5, False, id="half-its-timeout")],
)
def test_a_watch_is_very_short_under_half_its_one_second_timeout(lasted: float, backs_off: bool) -> None:
    """client-go's "very short watch", scaled to a short timeout: a 1 s watch (the least asked for)
    that ends empty within 0.5 s is a failure to back off from; one that lasted 0.5 s is not."""

    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            server.watch_faults.append("close")

        async with started(setup, clock_step=lasted, bookmark_interval=0.5) as h:
            await h.watch_count(2)
            assert h.sleep.delays == ([0.5] if backs_off else [])
            assert {r.query["timeoutSeconds"] for r in h.server.watches(POD_PATH)} == {"1"}

    run(main)


def test_a_short_watch_that_brought_events_is_healthy() -> None:
    """Ending at once is only suspicious when nothing came: a watch that delivered events and then
    ended (the server's timeout, a rolling restart) is followed by the next one at once."""

    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            two_pods(server)
            server.watch_faults.append("once")

        async with started(setup, clock_step=0.0) as h:
            await h.next(2)
            await h.watch_count(1)
            h.server.upsert(POD_PATH, pod("p3"))  # the watch sends it, then ends
            assert await h.next() == [("ADDED", "p3")]
            await h.watch_count(2)
            assert h.sleep.delays == []

    run(main)


def test_a_label_selector_scopes_the_list_and_the_watch() -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.upsert(POD_PATH, pod("p1"))
            server.upsert(
                POD_PATH, PodBuilder("other").namespace("ns1").labels(app="x").ready("10.0.0.8").build()
            )
            informer: Informer[PodObject] = Informer(
                client, PODS, "ns1", PodObject.from_api, label_selector="app=vllm", sleep=RecordingSleep()
            )
            names: asyncio.Queue[str] = asyncio.Queue()
            informer.add_handler(lambda e: names.put_nowait(e.key.name))
            task = asyncio.create_task(informer.run(), name="labelled")
            assert await asyncio.wait_for(names.get(), WAIT) == "p1"
            server.upsert(POD_PATH, PodBuilder("other2").namespace("ns1").labels(app="x").build())
            server.upsert(POD_PATH, pod("p2"))
            assert await asyncio.wait_for(names.get(), WAIT) == "p2"
            assert {r.query.get("labelSelector") for r in server.requests} == {"app=vllm"}
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(main)


def test_relists_and_replaced_watches_are_counted_each_time(caplog: pytest.LogCaptureFixture) -> None:
    """The debug view's counters grow with each 410 and each dead watch; a failed watch says why."""

    async def main() -> None:
        def setup(server: FakeApiServer) -> None:
            two_pods(server)
            server.watch_faults.extend(["hang", "hang", "500"])

        async with started(setup, bookmark_interval=0.25) as h:  # idle limit 0.5 s
            await h.next(2)
            await h.watch_count(4)
            assert h.informer.stalled_watches >= 2  # (the fourth watch, idle too, may be replaced by now)
            for _ in range(2):
                h.server.delete(POD_PATH, "p1" if h.informer.get(key("p1")) else "p2", record=False)
                h.server.compact(POD_PATH)
                await h.next()
            assert h.informer.relists == 2

    with caplog.at_level("INFO", logger="epp.k8s.informer"):
        run(main)
    said = [r.getMessage() for r in caplog.records]
    failed = [m for m in said if "watch failed" in m]
    assert failed == [
        "pods/ns1: watch failed: 500 InternalError: scripted failure; retrying in 0.50s (failure 1)"
    ]
    gone = (
        r"pods/ns1: resourceVersion (\d+) gone \(410 Expired: too old resource version: \1 \(\d+\)\): relist"
    )
    assert len([m for m in said if re.fullmatch(gone, m)]) == 2
    assert len([m for m in said if "gone" in m]) == 2
    stalled = (
        r"pods/ns1: watch showed no sign of life "
        r"\(watch http://\S+/api/v1/namespaces/ns1/pods: nothing read for 0\.5s\): replacing it"
    )
    replaced = [m for m in said if "no sign of life" in m]
    assert len(replaced) >= 2
    assert all(re.fullmatch(stalled, m) for m in replaced), replaced
