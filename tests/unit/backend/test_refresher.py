"""Per-pod refreshers against the real datastore, with a fake fetcher and an injected clock.

Covers epp-behaviour.md §9: #3/#20 (no task survives stop or close, double stop is safe), #6 (the
port is read from the current pool on every scrape), #10 (a hanging pod does not hold others back)
and the "late scrape never resurrects a deleted pod" invariant. Waiting is always by polling.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from epp.api.types import EndpointKey, InferencePool, NamespacedName, PodObject
from epp.backend.metrics.fetch import ScrapeError
from epp.backend.metrics.refresher import Fetcher, PodRefreshers
from epp.config import ProberConfig
from epp.datastore import Datastore, new_datastore
from harness.base.eventually import eventually_async

NS = "default"
FAST = 0.002  # refresh interval that keeps loops turning without a busy spin
NEVER = 3600.0  # refresh interval that leaves exactly one scrape (the immediate first one)


def page(waiting: int) -> str:
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    )


def pod(name: str, ip: str) -> PodObject:
    return PodObject(key=NamespacedName(NS, name), labels={"app": "vllm"}, pod_ip=ip, ready=True)


def pool(port: int = 8000) -> InferencePool:
    return InferencePool(key=NamespacedName(NS, "pool"), selector={"app": "vllm"}, target_ports=(port,))


class FakeFetcher:
    """Serves `page(n)` per address; `hooks` lets a test run code inside a fetch (block, delete...)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.waiting: dict[str, int] = {}
        self.waiting_at: dict[tuple[str, int], int] = {}  # per address and port, before `waiting`
        self.hooks: dict[str, Callable[[], Awaitable[None]]] = {}

    async def fetch(self, address: str, port: int) -> str:
        self.calls.append((address, port))
        hook = self.hooks.get(address)
        if hook is not None:
            await hook()
        return page(self.waiting_at.get((address, port), self.waiting.get(address, 1)))

    def count(self, address: str) -> int:
        return sum(1 for a, _ in self.calls if a == address)


def refresher_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("metrics-refresher")]


Scenario = Callable[[Datastore, PodRefreshers, FakeFetcher], Coroutine[Any, Any, None]]


def run(scenario: Scenario, interval: float = FAST, fetcher: FakeFetcher | None = None) -> None:
    """Wire fetcher → refreshers → real datastore, run the scenario, then close and check for leaks."""

    async def main() -> None:
        fake = fetcher or FakeFetcher()
        checked: Fetcher = fake  # the fake satisfies the Protocol
        clock = itertools.count(100).__next__
        refreshers = await PodRefreshers.create(checked, ProberConfig(refresh_interval=interval), clock)
        store = new_datastore(refreshers)
        store.pool_set(pool())
        try:
            await scenario(store, refreshers, fake)
        finally:
            await refreshers.aclose()
        assert refresher_tasks() == []
        assert refreshers.active() == frozenset()

    asyncio.run(main())


def test_first_scrape_is_immediate() -> None:
    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        fetcher.waiting["10.0.0.1"] = 4
        store.pod_update_or_add(pod("p1", "10.0.0.1"))

        async def scraped() -> None:
            got = store.pod_get(EndpointKey(NS, "p1"))
            assert got is not None
            assert got.metrics.waiting_queue_size == 4
            assert got.metrics.updated_at is not None

        await eventually_async(scraped)
        assert fetcher.calls == [("10.0.0.1", 8000)]

    run(scenario, interval=NEVER)


def test_each_rank_is_scraped_on_its_own_port_and_stops_when_its_port_goes() -> None:
    """One refresher per endpoint (pod and target port): the ranks of one pod never share metrics, and a
    shrink of the pool's target ports stops the removed rank's loop (upstream #2306)."""

    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        ranks = InferencePool(
            key=NamespacedName(NS, "pool"), selector={"app": "vllm"}, target_ports=(8000, 8001)
        )
        store.pool_set(ranks)
        fetcher.waiting_at[("10.0.0.1", 8001)] = 9
        store.pod_update_or_add(pod("p1", "10.0.0.1"))

        async def scraped() -> None:
            assert [
                e.metrics.waiting_queue_size for e in sorted(store.pod_get_all(), key=lambda e: e.pod.key)
            ] == [
                1,
                9,
            ]

        await eventually_async(scraped)
        assert sorted(fetcher.calls) == [("10.0.0.1", 8000), ("10.0.0.1", 8001)]
        assert refreshers.active() == {EndpointKey(NS, "p1", 0), EndpointKey(NS, "p1", 1)}

        store.pool_set(pool())

        async def stopped() -> None:
            assert refreshers.active() == {EndpointKey(NS, "p1", 0)}
            assert len(refresher_tasks()) == 1

        await eventually_async(stopped)

    run(scenario, interval=NEVER)


def test_only_stored_pods_are_probed() -> None:
    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        # p3 is not Ready: the resync leaves it out of the store, so nothing may probe it.
        unready = PodObject(NamespacedName(NS, "p3"), {"app": "vllm"}, "10.0.0.3", ready=False)
        store.pod_resync([pod("p1", "10.0.0.1"), pod("p2", "10.0.0.2"), unready])

        async def both() -> None:
            assert fetcher.count("10.0.0.1") >= 3
            assert fetcher.count("10.0.0.2") >= 3

        await eventually_async(both)
        assert {a for a, _ in fetcher.calls} == {"10.0.0.1", "10.0.0.2"}
        assert refreshers.active() == {EndpointKey(NS, "p1"), EndpointKey(NS, "p2")}

    run(scenario)


def test_hanging_pod_does_not_delay_the_others() -> None:
    """#10 (#99/#223/#460): one pod that never answers must not stall other pods' updates."""

    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        hung = asyncio.Event()

        async def hang() -> None:
            hung.set()
            await asyncio.Event().wait()  # never set: cancelled by aclose()

        fetcher.hooks["10.0.0.1"] = hang
        store.pod_update_or_add(pod("slow", "10.0.0.1"))
        await hung.wait()
        store.pod_update_or_add(pod("fast", "10.0.0.2"))
        seen: set[float] = set()

        async def fast_keeps_updating() -> None:
            got = store.pod_get(EndpointKey(NS, "fast"))
            assert got is not None
            if got.metrics.updated_at is not None:
                seen.add(got.metrics.updated_at)
            assert len(seen) >= 5, f"fast pod updated {len(seen)} times so far"

        await eventually_async(fast_keeps_updating, interval=0.001)
        slow = store.pod_get(EndpointKey(NS, "slow"))
        assert slow is not None
        assert slow.metrics.updated_at is None
        assert fetcher.count("10.0.0.1") == 1

    run(scenario)


@pytest.mark.parametrize("during_fetch", [True, False], ids=["deleted-inside-fetch", "deleted-while-blocked"])
def test_late_scrape_never_resurrects_a_deleted_pod(during_fetch: bool) -> None:
    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        key = EndpointKey(NS, "p1")
        release = asyncio.Event()
        entered = asyncio.Event()

        async def hook() -> None:
            entered.set()
            if during_fetch:
                store.pod_delete(key.pod)  # the scrape then completes after the pod is gone
            else:
                await release.wait()

        fetcher.hooks["10.0.0.1"] = hook
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        await entered.wait()
        if not during_fetch:
            store.pod_delete(key.pod)
            release.set()

        async def stopped() -> None:
            assert refresher_tasks() == []

        await eventually_async(stopped)
        assert store.pod_get(key) is None
        assert store.pod_get_all() == ()

    run(scenario)


def test_port_change_in_pool_is_used_by_next_scrape() -> None:
    """#6/#417: the port is read from the pool on every scrape, with no pod event."""

    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        await eventually_async(lambda: _assert_in(("10.0.0.1", 8000), fetcher.calls))
        store.pool_set(pool(port=9000))
        await eventually_async(lambda: _assert_equal(fetcher.calls[-1], ("10.0.0.1", 9000)))

    run(scenario)


def test_address_change_keeps_metrics_and_moves_the_scrape() -> None:
    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        key = EndpointKey(NS, "p1")
        fetcher.waiting["10.0.0.9"] = 9
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        await eventually_async(lambda: _assert_scraped(store, key))
        store.pod_update_or_add(pod("p1", "10.0.0.9"))

        async def moved() -> None:
            got = store.pod_get(key)
            assert got is not None
            assert got.metrics.waiting_queue_size == 9

        await eventually_async(moved)
        assert len(refresher_tasks()) == 1, "an address change is an update, not a second refresher"

    run(scenario)


def test_an_address_change_cancels_the_scrape_of_the_old_address() -> None:
    """The old address may hang for the whole scrape timeout: the new one is scraped at once instead."""

    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        key = EndpointKey(NS, "p1")
        entered, cancelled = asyncio.Event(), asyncio.Event()

        async def old_address_hangs() -> None:
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        fetcher.hooks["10.0.0.1"] = old_address_hangs
        fetcher.waiting.update({"10.0.0.1": 7, "10.0.0.9": 9})
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        await entered.wait()
        store.pod_update_or_add(pod("p1", "10.0.0.9"))

        async def new_address_scraped() -> None:
            got = store.pod_get(key)
            assert got is not None
            assert (got.pod.address, got.metrics.waiting_queue_size) == ("10.0.0.9", 9)

        await eventually_async(new_address_scraped)
        assert cancelled.is_set()
        assert len(refresher_tasks()) == 1

    run(scenario, interval=NEVER)


def test_a_scrape_of_the_old_address_that_lands_after_the_change_is_dropped() -> None:
    """Its page describes a server the pod no longer is; stored, it would look fresh for 2 s."""

    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        key = EndpointKey(NS, "p1")

        async def move_while_fetching() -> None:
            store.pod_update_or_add(pod("p1", "10.0.0.9"))  # then this fetch returns the old page

        fetcher.hooks["10.0.0.1"] = move_while_fetching
        fetcher.waiting.update({"10.0.0.1": 7, "10.0.0.9": 9})
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        await eventually_async(lambda: _assert_scraped(store, key))
        got = store.pod_get(key)
        assert got is not None
        assert got.metrics.waiting_queue_size == 9, "metrics of the old address were stored"

    run(scenario, interval=NEVER)


def test_stop_cancels_the_task_and_double_stop_is_safe() -> None:
    """#3/#20/#824: removing a pod ends its loop; a second stop does nothing."""

    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        key = EndpointKey(NS, "p1")
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        store.pod_update_or_add(pod("p2", "10.0.0.2"))
        await eventually_async(lambda: _assert_scraped(store, key))
        store.pod_delete(key.pod)
        refreshers.pod_removed(key)
        refreshers.pod_removed(key)

        async def gone() -> None:
            assert [t.get_name() for t in refresher_tasks()] == ["metrics-refresher default/p2"]

        await eventually_async(gone)
        assert refreshers.active() == {EndpointKey(NS, "p2")}
        before = fetcher.count("10.0.0.1")
        await eventually_async(lambda: _assert_more(fetcher.count("10.0.0.2"), 20))
        assert fetcher.count("10.0.0.1") == before

    run(scenario)


def test_aclose_leaves_no_task_and_ignores_later_adds() -> None:
    async def main() -> None:
        fetcher = FakeFetcher()
        refreshers = await PodRefreshers.create(fetcher, ProberConfig(refresh_interval=FAST))
        store = new_datastore(refreshers)
        store.pool_set(pool())
        for i in range(3):
            store.pod_update_or_add(pod(f"p{i}", f"10.0.0.{i}"))
        assert len(refresher_tasks()) == 3
        await refreshers.aclose()
        assert refresher_tasks() == []
        store.pod_update_or_add(pod("late", "10.0.0.7"))
        assert refresher_tasks() == []
        assert refreshers.active() == frozenset()
        await refreshers.aclose()  # closing twice is harmless

    asyncio.run(main())


def test_pool_clear_stops_every_refresher() -> None:
    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        for i in range(3):
            store.pod_update_or_add(pod(f"p{i}", f"10.0.0.{i}"))
        store.clear()

        async def none_left() -> None:
            assert refresher_tasks() == []

        await eventually_async(none_left)

    run(scenario)


def test_scrape_errors_are_survived() -> None:
    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        failures = iter(range(3))

        async def flaky() -> None:
            if next(failures, None) is not None:
                raise ScrapeError("connection refused")

        fetcher.hooks["10.0.0.1"] = flaky
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        await eventually_async(lambda: _assert_scraped(store, EndpointKey(NS, "p1")))
        assert fetcher.count("10.0.0.1") >= 4

    run(scenario)


def test_unexpected_error_is_logged_once_and_survived(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        failures = iter(range(5))

        async def broken() -> None:
            if next(failures, None) is not None:
                raise RuntimeError("bug")

        fetcher.hooks["10.0.0.1"] = broken
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        await eventually_async(lambda: _assert_scraped(store, EndpointKey(NS, "p1")))

    run(scenario)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert "metrics refresh of default/p1 failed" in errors[0].getMessage()


def test_page_without_any_wanted_family_does_not_refresh_the_snapshot() -> None:
    """A page that teaches nothing (wrong server on the port?) must leave the pod looking stale."""

    class WrongServer(FakeFetcher):
        async def fetch(self, address: str, port: int) -> str:
            self.calls.append((address, port))
            return "# TYPE something_else gauge\nsomething_else 1\n"

    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        await eventually_async(lambda: _assert_more(fetcher.count("10.0.0.1"), 3))
        got = store.pod_get(EndpointKey(NS, "p1"))
        assert got is not None
        assert got.metrics.updated_at is None

    run(scenario, fetcher=WrongServer())


def test_lifecycle_calls_from_another_thread_are_forwarded_to_the_loop() -> None:
    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        key = EndpointKey(NS, "p1")
        await asyncio.to_thread(store.pod_update_or_add, pod("p1", "10.0.0.1"))
        await eventually_async(lambda: _assert_scraped(store, key))
        await asyncio.to_thread(store.pod_delete, key.pod)

        async def gone() -> None:
            assert refresher_tasks() == []

        await eventually_async(gone)

    run(scenario)


def test_updated_at_comes_from_the_injected_clock() -> None:
    async def scenario(store: Datastore, refreshers: PodRefreshers, fetcher: FakeFetcher) -> None:
        store.pod_update_or_add(pod("p1", "10.0.0.1"))
        await eventually_async(lambda: _assert_scraped(store, EndpointKey(NS, "p1")))
        got = store.pod_get(EndpointKey(NS, "p1"))
        assert got is not None
        assert got.metrics.updated_at == 100, "the first clock reading"

    run(scenario, interval=NEVER)


async def _assert_scraped(store: Datastore, key: EndpointKey) -> None:
    got = store.pod_get(key)
    assert got is not None
    assert got.metrics.updated_at is not None


async def _assert_in(item: object, items: list[Any]) -> None:
    assert item in items


async def _assert_equal(a: object, b: object) -> None:
    assert a == b


async def _assert_more(value: int, than: int) -> None:
    assert value > than
