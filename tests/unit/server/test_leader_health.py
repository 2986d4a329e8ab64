"""`--ha-enable-leader-election` in the runner: only the Lease holder reports SERVING (upstream #1264);
a drain hands the Lease over first. The elector itself: tests/unit/k8s/test_leader.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from epp.config import LeaderElectionConfig
from epp.server.runner import Epp, LeaderElectorLike
from harness.base.eventually import eventually_async

from .support import LOOPBACK_CONFIG, NoScrapes, SeedingControllers, seed_pool
from .test_drain import NOT_SERVING, SERVING, health

WAIT_S = 10.0


class FakeElector:
    def __init__(self) -> None:
        self.leader = False
        self.released = 0

    @property
    def is_leader(self) -> bool:
        return self.leader

    async def run(self) -> None:
        await asyncio.get_running_loop().create_future()  # until cancelled

    async def release(self) -> None:
        self.released += 1
        self.leader = False


_typed: LeaderElectorLike = FakeElector()


def make(elector: FakeElector) -> Epp:
    return Epp(
        replace(LOOPBACK_CONFIG, shutdown_delay=0.0, shutdown_grace_period=0.0),
        registry=CollectorRegistry(),
        controllers=lambda store: SeedingControllers(store, seed_pool),
        fetcher=NoScrapes(),
        leader_elector=elector,
    )


def test_only_the_leader_is_serving_and_a_drain_hands_the_lease_over() -> None:
    async def scenario() -> None:
        elector = FakeElector()
        epp = make(elector)
        await epp.start()
        try:
            await epp.wait_ready()  # synced and pool known: an active-active replica would serve now
            assert await health(epp) == NOT_SERVING
            assert "leader-election" in epp.task_names
            elector.leader = True

            async def serving() -> None:
                assert await health(epp) == SERVING

            await eventually_async(serving, timeout=WAIT_S)
            elector.leader = False  # lost the Lease (another replica took it)
            assert await health(epp) == NOT_SERVING
            elector.leader = True
            await epp.drain()
            assert elector.released >= 1
        finally:
            await epp.stop()

    asyncio.run(scenario())


def test_leader_election_needs_the_api() -> None:
    config = replace(LOOPBACK_CONFIG, leader_election=LeaderElectionConfig(enabled=True, identity="a"))
    with pytest.raises(ValueError, match="leader election needs a kube_client"):
        Epp(
            config,
            registry=CollectorRegistry(),
            controllers=lambda store: SeedingControllers(store, seed_pool),
        )
