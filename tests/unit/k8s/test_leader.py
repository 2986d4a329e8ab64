"""Leader election over a Lease (`--ha-enable-leader-election`, epp.k8s.leader): the pure decision
table, then two electors sharing an in-memory Lease store with the API server's optimistic
concurrency (a write with a stale resourceVersion is 409 Conflict) and an injected clock.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from epp.api import NamespacedName
from epp.k8s.client import KubeClient
from epp.k8s.errors import ApiError, KubeConnectionError
from epp.k8s.leader import (
    CREATE,
    LEASES,
    RENEW,
    TAKE,
    WAIT,
    LeaderElector,
    LeaseClient,
    LeaseSettings,
    Observed,
    decide,
)

from .fake_apiserver import FakeApiServer
from .support import plain_config, run

POOL = NamespacedName("ns1", "pool")


def lease(holder: str, renew: str = "t1", transitions: int = 0) -> dict[str, Any]:
    return {"spec": {"holderIdentity": holder, "renewTime": renew, "leaseTransitions": transitions}}


def seen(holder: str, renew: str = "t1", transitions: int = 0, at: float = 0.0) -> Observed:
    return Observed(holder, (holder, renew, transitions, ""), at, 15.0)


@pytest.mark.parametrize(
    ("current", "observed", "now", "step"),
    [
        pytest.param(None, None, 0.0, CREATE, id="no-lease-create"),
        pytest.param(lease("me"), seen("me"), 100.0, RENEW, id="ours-renew"),
        pytest.param(lease(""), seen(""), 0.0, TAKE, id="released-take-at-once"),
        pytest.param(lease("other"), seen("other", at=0.0), 14.9, WAIT, id="held-and-fresh-wait"),
        pytest.param(lease("other"), seen("other", at=0.0), 15.0, TAKE, id="unchanged-for-a-duration-take"),
        pytest.param(lease("other", "t2"), seen("other", "t1", at=0.0), 30.0, WAIT, id="renewed-since-wait"),
        pytest.param(lease("other"), None, 100.0, WAIT, id="first-sight-wait"),
        # Any field of the record that moved is a sign of life, leaseTransitions too.
        pytest.param(
            lease("other", transitions=1), seen("other", at=0.0), 30.0, WAIT, id="handed-over-since-wait"
        ),
    ],
)
def test_decide(current: dict[str, Any] | None, observed: Observed | None, now: float, step: str) -> None:
    assert decide(current, "me", observed, now) == step


class LeaseStore:
    """The API server's side: objects by path, resourceVersion checked on replace."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise KubeConnectionError("connection refused")

    async def get_object(self, path: str) -> dict[str, Any] | None:
        self._check()
        found = self.objects.get(path)
        return None if found is None else copy.deepcopy(found)

    async def create_object(self, collection_path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        self._check()
        path = f"{collection_path}/{obj['metadata']['name']}"
        if path in self.objects:
            raise ApiError(409, "AlreadyExists")
        return self._store(path, obj)

    async def replace_object(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        self._check()
        current = self.objects.get(path)
        if current is None:
            raise ApiError(404, "NotFound")
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict")
        return self._store(path, obj)

    def _store(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.rv += 1
        stored = copy.deepcopy(dict(obj))
        stored["metadata"] = {**stored["metadata"], "resourceVersion": str(self.rv)}
        self.objects[path] = stored
        return copy.deepcopy(stored)

    def holder(self) -> str:
        (only,) = self.objects.values()
        return str(only["spec"]["holderIdentity"])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def elector(store: LeaseClient, clock: Clock, identity: str) -> LeaderElector:
    return LeaderElector(
        store,
        POOL,
        LeaseSettings(identity, lease_duration=15.0, renew_deadline=10.0, retry_period=2.0),
        monotonic=clock,
        wall=lambda: datetime(2025, 1, 1, tzinfo=UTC),
    )


def test_one_leader_and_the_next_takes_over_when_it_goes() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), Clock()
        a, b = elector(store, clock, "a"), elector(store, clock, "b")
        await a.try_once()
        await b.try_once()
        assert (a.is_leader, b.is_leader, store.holder()) == (True, False, "a")
        assert a.lease_name == "epp-ns1-pool.gateway-api-inference-extension.sigs.k8s.io"
        for _ in range(10):  # a renews every retry period: b never takes over
            clock.now += 2.0
            await a.try_once()
            await b.try_once()
        assert (a.is_leader, b.is_leader) == (True, False)
        # a's pod dies without a word: after one lease duration unchanged, b takes the Lease.
        clock.now += 14.0
        await b.try_once()
        assert not b.is_leader
        clock.now += 2.0
        await b.try_once()
        assert (b.is_leader, store.holder()) == (True, "b")
        assert store.objects[next(iter(store.objects))]["spec"]["leaseTransitions"] == 1

    asyncio.run(main())


def test_release_hands_over_at_once() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), Clock()
        a, b = elector(store, clock, "a"), elector(store, clock, "b")
        await a.try_once()
        await b.try_once()
        await a.release()
        assert not a.is_leader
        await b.try_once()  # no waiting for the lease duration
        assert (b.is_leader, store.holder()) == (True, "b")
        await a.try_once()  # a released for good (it is stopping)
        assert not a.is_leader

    asyncio.run(main())


def test_two_takers_of_an_expired_lease_one_wins() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), Clock()
        gone, b, c = elector(store, clock, "gone"), elector(store, clock, "b"), elector(store, clock, "c")
        await gone.try_once()
        await b.try_once()
        await c.try_once()
        clock.now += 15.0
        # Both read the same expired Lease before either writes.
        await asyncio.gather(b.try_once(), c.try_once())
        assert [b.is_leader, c.is_leader].count(True) == 1
        assert store.holder() in ("b", "c")

    asyncio.run(main())


def test_a_leader_that_cannot_renew_steps_down_before_its_lease_expires() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), Clock()
        a = elector(store, clock, "a")
        await a.try_once()
        store.down = True
        clock.now += 9.0
        await a.try_once()
        assert a.is_leader  # within the renew deadline
        clock.now += 1.0
        await a.try_once()
        assert not a.is_leader  # 10 s without a renewal: NOT_SERVING, 5 s before others may take it

    asyncio.run(main())


def test_a_renewal_stuck_in_a_hung_call_does_not_keep_the_leader_serving() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), Clock()
        a = elector(store, clock, "a")
        await a.try_once()
        clock.now += 9.9
        assert a.is_leader
        clock.now += 0.1  # no try_once returned meanwhile (the API hangs): the deadline alone decides
        assert not a.is_leader

    asyncio.run(main())


ORDER = "leader election needs 0 < retry_period < renew_deadline < lease_duration"


@pytest.mark.parametrize(
    ("identity", "timing", "message"),
    [
        pytest.param("", {}, "leader election needs an identity", id="no-identity"),
        pytest.param("a", {"retry_period": 0.0}, ORDER, id="retry-period-zero"),
        pytest.param("a", {"retry_period": -1.0}, ORDER, id="retry-period-negative"),
        pytest.param("a", {"retry_period": 10.0, "renew_deadline": 10.0}, ORDER, id="retry-as-long-as-renew"),
        pytest.param(
            "a", {"renew_deadline": 15.0, "lease_duration": 15.0}, ORDER, id="renew-as-long-as-lease"
        ),
    ],
)
def test_settings_that_cannot_elect_are_refused_saying_what_is_needed(
    identity: str, timing: dict[str, float], message: str
) -> None:
    """A retry period of 0 would spin on the API server; retrying no faster than the renew deadline
    lets a healthy leader step down between two tries; renewing no sooner than the Lease expires
    lets two replicas serve at once. The operator reads the rule in the error."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        LeaseSettings(identity, **timing)


def test_the_lease_goes_through_the_real_client() -> None:
    """KubeClient's get/create/replace against the fake API server: 404 is None, a stale write 409."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            clock = Clock()
            a, b = elector(client, clock, "a"), elector(client, clock, "b")
            await a.try_once()
            await b.try_once()
            assert (a.is_leader, b.is_leader) == (True, False)
            path = f"{LEASES.format(namespace='ns1')}/{a.lease_name}"
            stored = await client.get_object(path)
            assert stored is not None
            assert stored["spec"]["holderIdentity"] == "a"
            assert await client.get_object(f"{LEASES.format(namespace='ns1')}/nothing") is None
            stale = {**stored, "metadata": {**stored["metadata"], "resourceVersion": "1"}}
            with pytest.raises(ApiError) as conflict:
                await client.replace_object(path, stale)
            assert conflict.value.status == 409
            await a.release()
            await b.try_once()
            assert b.is_leader

    run(main)


class Wall:
    """A wall clock that advances one second per reading: each write's stamps are told apart."""

    def __init__(self) -> None:
        self.second = 0

    def __call__(self) -> datetime:
        self.second += 1
        return datetime(2025, 1, 1, 0, 0, self.second, 250, tzinfo=UTC)


def walled(
    store: LeaseClient, clock: Clock, identity: str, wall: Wall, duration: float = 15.0
) -> LeaderElector:
    settings = LeaseSettings(identity, lease_duration=duration, renew_deadline=10.0, retry_period=2.0)
    return LeaderElector(store, POOL, settings, monotonic=clock, wall=wall)


def only(store: LeaseStore) -> dict[str, Any]:
    (stored,) = store.objects.values()
    return stored


def test_the_lease_written_is_the_one_client_go_writes() -> None:
    """Create, renew, take and release write the fields client-go's resourcelock reads (kubectl and
    another elector of any language must understand whom the Lease names and since when)."""

    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        a, b = walled(store, clock, "a", wall, duration=15.9), walled(store, clock, "b", wall)
        await a.try_once()
        path = f"{LEASES.format(namespace='ns1')}/{a.lease_name}"
        assert list(store.objects) == [path]
        assert only(store) == {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": a.lease_name, "resourceVersion": "1"},
            "spec": {
                "holderIdentity": "a",
                "leaseDurationSeconds": 15,
                "acquireTime": "2025-01-01T00:00:01.000250Z",
                "renewTime": "2025-01-01T00:00:01.000250Z",
                "leaseTransitions": 0,
            },
        }
        clock.now += 2.0
        await a.try_once()  # a renewal moves renewTime only
        assert only(store)["spec"] == {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "acquireTime": "2025-01-01T00:00:01.000250Z",
            "renewTime": "2025-01-01T00:00:02.000250Z",
            "leaseTransitions": 0,
        }
        await a.release()  # holder emptied, one second left: the next elector need not wait
        assert only(store)["spec"] == {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": "2025-01-01T00:00:01.000250Z",
            "renewTime": "2025-01-01T00:00:03.000250Z",
            "leaseTransitions": 0,
        }
        await b.try_once()  # a take counts a transition and stamps the acquisition
        assert only(store)["spec"] == {
            "holderIdentity": "b",
            "leaseDurationSeconds": 15,
            "acquireTime": "2025-01-01T00:00:04.000250Z",
            "renewTime": "2025-01-01T00:00:04.000250Z",
            "leaseTransitions": 1,
        }
        assert only(store)["metadata"]["resourceVersion"] == "4"  # create, renew, release, take

    asyncio.run(main())


def test_the_holders_own_lease_duration_decides_when_it_expires() -> None:
    """Another replica's Lease may say 30 s (its flag): we wait its 30 s, not our 15 s."""

    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        slow = walled(store, clock, "slow", wall, duration=30.0)
        b = walled(store, clock, "b", wall)
        await slow.try_once()
        await b.try_once()
        clock.now += 29.0
        await b.try_once()
        assert (b.is_leader, store.holder()) == (False, "slow")
        clock.now += 1.0
        await b.try_once()
        assert (b.is_leader, store.holder()) == (True, "b")

    asyncio.run(main())


def test_a_lease_deleted_under_the_elector_is_created_again() -> None:
    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        a, b = walled(store, clock, "a", wall), walled(store, clock, "b", wall)
        await a.try_once()
        await b.try_once()
        store.objects.clear()
        await b.try_once()  # nothing to wait for: created, not taken
        assert (b.is_leader, store.holder(), only(store)["spec"]["leaseTransitions"]) == (True, "b", 0)

    asyncio.run(main())


def test_release_writes_nothing_unless_it_holds_the_lease() -> None:
    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        a, b = walled(store, clock, "a", wall), walled(store, clock, "b", wall)
        await a.try_once()
        await b.try_once()
        before = copy.deepcopy(store.objects)
        await b.release()  # never the leader
        assert store.objects == before
        # a believes it leads, but the Lease moved on meanwhile: releasing must not empty b's Lease.
        stolen = only(store)
        stolen["spec"]["holderIdentity"] = "c"
        before = copy.deepcopy(store.objects)
        await a.release()
        assert store.objects == before
        assert not a.is_leader

    asyncio.run(main())


def test_a_failed_release_is_a_warning_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        a = walled(store, clock, "a", wall)
        await a.try_once()
        store.down = True
        await a.release()
        assert not a.is_leader

    with caplog.at_level("WARNING", logger="epp.k8s.leader"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records] == [
        "leader election: could not release lease "
        "epp-ns1-pool.gateway-api-inference-extension.sigs.k8s.io: connection refused"
    ]


def test_a_failure_streak_warns_once_and_a_lost_renewal_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """RBAC without leases would otherwise be silent forever, or fill the log every retry period.
    Any answer ends a streak: a renewal, or a wait behind another holder."""

    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        a, b = walled(store, clock, "a", wall), walled(store, clock, "b", wall)
        await a.try_once()
        store.down = True
        for _ in range(5):
            clock.now += 2.0
            await a.try_once()
        assert a.is_leader is False  # the renewal is lost: a bool, as typed, not merely falsy
        store.down = False
        await a.try_once()
        assert a.is_leader  # took its own Lease back: it was still named in it
        store.down = True
        await a.try_once()
        await b.try_once()
        store.down = False
        await b.try_once()  # waits behind a
        store.down = True
        await b.try_once()

    with caplog.at_level("INFO", logger="epp.k8s.leader"):
        asyncio.run(main())
    name = "epp-ns1-pool.gateway-api-inference-extension.sigs.k8s.io"
    assert [r.getMessage() for r in caplog.records] == [
        f"leader election: holding lease {name}",
        "leader election: connection refused",
        "leader election: could not renew for 10s: connection refused",
        f"leader election: not holding lease {name}",
        f"leader election: holding lease {name}",
        "leader election: connection refused",
        "leader election: connection refused",  # b's first failure
        "leader election: connection refused",  # b again, after a wait ended its streak
    ]


def test_each_take_counts_one_more_transition() -> None:
    """leaseTransitions counts hand-overs over the Lease's whole life, whoever held it before."""

    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        electors = [walled(store, clock, name, wall) for name in ("a", "b", "c")]
        await electors[0].try_once()
        for holder, taker in itertools.pairwise(electors):
            await holder.release()
            await taker.try_once()
        assert (store.holder(), only(store)["spec"]["leaseTransitions"]) == ("c", 2)

    asyncio.run(main())


def test_a_lease_duration_under_two_seconds_is_written_as_one() -> None:
    async def main() -> None:
        store = LeaseStore()
        settings = LeaseSettings("quick", lease_duration=1.5, renew_deadline=1.0, retry_period=0.5)
        await LeaderElector(store, POOL, settings, monotonic=Clock(), wall=Wall()).try_once()
        assert only(store)["spec"]["leaseDurationSeconds"] == 1

    asyncio.run(main())


def test_no_elector_leads_before_its_first_write_nor_after_releasing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new replica is NOT_SERVING until it holds the Lease; one that released it (drain, stop)
    never takes it back, even when nobody else does; each change of role is logged once."""

    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        a = walled(store, clock, "a", wall)
        assert not a.is_leader
        await a.try_once()
        await a.try_once()
        assert a.is_leader
        await a.release()
        for _ in range(3):
            clock.now += 2.0
            await a.try_once()
        assert (a.is_leader, store.holder()) == (False, "")

    with caplog.at_level("INFO", logger="epp.k8s.leader"):
        asyncio.run(main())
    name = "epp-ns1-pool.gateway-api-inference-extension.sigs.k8s.io"
    assert [r.getMessage() for r in caplog.records] == [
        f"leader election: holding lease {name}",
        f"leader election: not holding lease {name}",
        f"leader election: lease {name} released",
    ]


def test_a_first_attempt_that_fails_warns(caplog: pytest.LogCaptureFixture) -> None:
    """RBAC without leases: the very first failure is the one an operator must see."""

    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        store.down = True
        await walled(store, clock, "a", wall).try_once()

    with caplog.at_level("DEBUG", logger="epp.k8s.leader"):
        asyncio.run(main())
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "leader election: connection refused")
    ]


def test_run_tries_every_retry_period_until_cancelled() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), Clock()
        delays: list[float] = []
        tried = asyncio.Event()

        async def sleep(delay: float) -> None:
            delays.append(delay)
            if len(delays) == 3:
                tried.set()
                await asyncio.Event().wait()

        elector = LeaderElector(
            store,
            POOL,
            LeaseSettings("a", lease_duration=15.0, renew_deadline=10.0, retry_period=2.0),
            monotonic=clock,
            wall=Wall(),
            sleep=sleep,
        )
        task = asyncio.create_task(elector.run())
        await asyncio.wait_for(tried.wait(), 10.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert delays == [2.0, 2.0, 2.0]
        assert only(store)["metadata"]["resourceVersion"] == "3"  # created, then renewed twice

    asyncio.run(main())


@pytest.mark.parametrize(
    ("transitions", "written"),
    [pytest.param(None, 1, id="field-omitted"), pytest.param(3, 4, id="three-before")],
)
def test_a_lease_another_elector_wrote_is_waited_behind_then_taken_as_one_more_transition(
    transitions: int | None, written: int
) -> None:
    """leaseTransitions is optional in the Lease API (another implementation, or kubectl, may leave
    it out): such a Lease is still waited behind for its duration, then taken as one transition more
    than it records (the first when it records none)."""

    async def main() -> None:
        store, clock, wall = LeaseStore(), Clock(), Wall()
        b = walled(store, clock, "b", wall)
        spec: dict[str, Any] = {
            "holderIdentity": "other",
            "leaseDurationSeconds": 15,
            "renewTime": "2024-12-31T23:59:59.000000Z",
        }
        if transitions is not None:
            spec["leaseTransitions"] = transitions
        store.objects[f"{LEASES.format(namespace='ns1')}/{b.lease_name}"] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": b.lease_name, "resourceVersion": "7"},
            "spec": spec,
        }
        await b.try_once()
        clock.now += 14.0
        await b.try_once()
        assert (b.is_leader, store.holder()) == (False, "other")
        clock.now += 1.0
        await b.try_once()
        assert (b.is_leader, store.holder(), only(store)["spec"]["leaseTransitions"]) == (True, "b", written)

    run(main)
