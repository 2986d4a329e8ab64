"""An `Epp` on loopback with ephemeral ports, fake controllers that seed the datastore, no scraping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from epp.api import v1alpha2
from epp.api.types import PodObject
from epp.backend.metrics import Fetcher, ScrapeError
from epp.config import ServerConfig
from epp.datastore import Datastore
from epp.k8s.controllers import WatchProgress
from epp.server.runner import ControllersLike, Epp
from harness.cluster.builders import ModelBuilder, PodBuilder, PoolBuilder

Seed = Callable[[Datastore], None]

LOOPBACK_CONFIG = ServerConfig(
    pool_name="pool",
    pool_namespace="default",
    grpc_port=0,
    grpc_health_port=0,
    metrics_port=0,
    debug_port=0,
    bind_address="127.0.0.1",
    secure_serving=False,
)


class SeedingControllers:
    """Stands in for the watch layer: applies `seed` (the state the API server would have), then idles."""

    def __init__(self, store: Datastore, seed: Seed | None, fail: BaseException | None = None) -> None:
        self._store = store
        self._seed = seed
        self._fail = fail
        self._synced = False

    @property
    def has_synced(self) -> bool:
        return self._synced

    def progress(self) -> tuple[WatchProgress, ...]:
        return ()  # no watches: the datastore is seeded directly

    async def run(self) -> None:
        if self._seed is not None:
            self._seed(self._store)
        self._synced = True
        if self._fail is not None:
            await asyncio.sleep(0)
            raise type(self._fail)(*self._fail.args)
        await asyncio.get_running_loop().create_future()


def _typed(store: Datastore) -> ControllersLike:
    return SeedingControllers(store, None)


class NoScrapes:
    async def fetch(self, address: str, port: int) -> str:
        raise ScrapeError(f"no model servers in unit tests ({address}:{port})")


_fetcher: Fetcher = NoScrapes()


def seed_pool(store: Datastore) -> None:
    store.pool_set(v1alpha2.pool_from_api(PoolBuilder("pool").selector(app="vllm").port(8000).build()))
    store.rewrite_set(
        v1alpha2.model_from_api(
            ModelBuilder("m").model_name("food-review").criticality("Critical").pool("pool").build()
        )
    )
    store.pod_update_or_add(
        PodObject.from_api(PodBuilder("pod-1").labels(app="vllm").ready("10.0.0.1").build())
    )


def make_epp(
    seed: Seed | None = seed_pool,
    *,
    fail: BaseException | None = None,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.monotonic,
    config: ServerConfig = LOOPBACK_CONFIG,
) -> Epp:
    return Epp(
        config,
        registry=registry or CollectorRegistry(),
        controllers=lambda store: SeedingControllers(store, seed, fail),
        fetcher=NoScrapes(),
        clock=clock,
    )
