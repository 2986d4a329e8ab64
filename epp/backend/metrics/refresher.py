"""One scrape loop per pod, started when the pod enters the datastore and cancelled when it leaves.

Why one task per pod (upstream #99/#223/#460): with one shared round, a single hanging pod held
every other pod's metrics back for the full 5 s timeout. Here each pod has its own loop and its own
per-request timeout, so a slow pod only makes its own metrics stale.

One loop per endpoint, i.e. per pod and target port: each rank of a multi-port pod is scraped on its
own port. Each pass re-reads the endpoint from the store: the address may have changed, and so may
the port, which the store keeps equal to the pool's (upstream #417 froze it at add time). The result
is written with `pod_update_metrics_if_exist` for the address and port scraped, so a scrape that
lands after the endpoint was deleted never brings it back, and one of an address or port it no
longer has is dropped. An address or port change restarts the loop (`pod_moved`): the scrape in
flight to the old one,
which may hang until its timeout, is cancelled and the new address is scraped at once. Scrape, then
sleep: the first scrape is immediate, as in v0.2/v0.3. Which metric names are read depends on the
pod's engine (`engine_of`: vllm, sglang, trtllm-serve, triton-tensorrt-llm, or a config file's own).

`PodRefreshers` owns every task it starts (STYLE habit 6): `pod_removed` cancels one (twice is
harmless), `pod_moved` replaces one, `aclose()` cancels and awaits all of them; nothing else creates
these tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from epp.api.types import EndpointKey
from epp.backend.metrics.fetch import ScrapeError
from epp.backend.metrics.parse import compile_metric_names, parse_page
from epp.config import ProberConfig
from epp.datastore import Datastore
from epp.datastore.types import Pod

logger = logging.getLogger(__name__)


def engine_of(pod: Pod, label_key: str) -> str:
    """The pod's model-server engine: the value of its ``label_key`` label
    (`ProberConfig.engine_label_key`, `inference.networking.k8s.io/engine-type` by default), ""
    when unlabelled."""
    return pod.label(label_key)


class Fetcher(Protocol):
    """What the refresher needs from the HTTP layer; tests pass fakes."""

    async def fetch(self, address: str, port: int) -> str: ...


class PodRefreshers:
    """The `PodLifecycleListener` that keeps every stored pod's metrics current."""

    def __init__(
        self,
        fetcher: Fetcher,
        config: ProberConfig,
        loop: asyncio.AbstractEventLoop,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetcher = fetcher
        self._interval = config.refresh_interval
        # Parsed once here, so a bad metric flag fails at construction, not in every scrape. One
        # plan per engine; a pod whose engine has none (or no engine) gets the default engine's.
        self._plans = {engine: compile_metric_names(names) for engine, names in config.engine_names().items()}
        self._default_plan = self._plans[config.default_engine]
        # 0: the pool's target port (upstream's deprecated --model-server-metrics-port otherwise).
        self._port = config.port
        self._engine_label = config.engine_label_key
        self._loop = loop
        self._clock = clock
        # Touched only on the loop thread (calls from other threads are forwarded to it).
        self._tasks: dict[EndpointKey, asyncio.Task[None]] = {}
        # Cancelled but not finished yet (a removed or moved pod's loop): aclose() waits for these too.
        self._stopping: set[asyncio.Task[None]] = set()
        self._closed = False

    @classmethod
    async def create(
        cls, fetcher: Fetcher, config: ProberConfig, clock: Callable[[], float] = time.monotonic
    ) -> PodRefreshers:
        """Construct bound to the running loop."""
        return cls(fetcher, config, asyncio.get_running_loop(), clock)

    # --- PodLifecycleListener --------------------------------------------------------------------
    # Reconcilers call these on the loop thread; a call from any other thread is forwarded to the
    # loop, so the task table is only ever touched there.
    def pod_added(self, key: EndpointKey, store: Datastore) -> None:
        if self._on_loop():
            self._start(key, store)
        else:
            self._loop.call_soon_threadsafe(self._start, key, store)

    def pod_removed(self, key: EndpointKey) -> None:
        if self._on_loop():
            self._stop(key)
        else:
            self._loop.call_soon_threadsafe(self._stop, key)

    def pod_moved(self, key: EndpointKey, store: Datastore) -> None:
        if self._on_loop():
            self._restart(key, store)
        else:
            self._loop.call_soon_threadsafe(self._restart, key, store)

    # --- ownership -------------------------------------------------------------------------------
    def active(self) -> frozenset[EndpointKey]:
        """Pods with a live refresher (for the debug view and tests)."""
        return frozenset(k for k, t in self._tasks.items() if not t.done())

    async def aclose(self) -> None:
        """Cancel every refresher and wait until they have all finished; later adds are ignored."""
        self._closed = True
        tasks = [*self._tasks.values(), *self._stopping]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _start(self, key: EndpointKey, store: Datastore) -> None:
        if self._closed:
            logger.debug("refreshers closed; not probing %s", key)
            return
        current = self._tasks.get(key)
        if current is not None and not current.done():
            return
        task = self._loop.create_task(self._run(key, store), name=f"metrics-refresher {key}")
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._forget(key, t))

    def _stop(self, key: EndpointKey) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
            self._stopping.add(task)

    def _restart(self, key: EndpointKey, store: Datastore) -> None:
        """New address: drop the scrape in flight (the old address may hang) and scrape the new one now."""
        if key in self._tasks:
            self._stop(key)
            self._start(key, store)

    def _forget(self, key: EndpointKey, task: asyncio.Task[None]) -> None:
        self._stopping.discard(task)
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled() and task.exception() is not None:
            logger.error("metrics refresher for %s died", key, exc_info=task.exception())

    # --- the loop --------------------------------------------------------------------------------
    async def _run(self, key: EndpointKey, store: Datastore) -> None:
        reported = False
        while True:
            try:
                await self._scrape_once(key, store)
                reported = False
            except ScrapeError as exc:
                logger.debug("scrape of %s failed: %s", key, exc)
            except Exception:
                # A bug, not a pod problem: say it once per failure streak, not 20 times a second.
                if not reported:
                    logger.exception("metrics refresh of %s failed", key)
                    reported = True
            await asyncio.sleep(self._interval)

    async def _scrape_once(self, key: EndpointKey, store: Datastore) -> None:
        pod = store.pod_get(key)
        if pod is None:
            return
        address, port = pod.pod.address, pod.pod.port
        # The endpoint's own port, unless a metrics port is configured (upstream's deprecated flag).
        text = await self._fetcher.fetch(address, self._port or port)
        plan = self._plans.get(engine_of(pod.pod, self._engine_label), self._default_plan)
        result = parse_page(text, plan, pod.metrics, self._clock())
        if result.errors:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("metrics of %s: %s", key, "; ".join(result.errors))
            if result.families_found == 0:
                # Nothing learnt (wrong page?): keep the old snapshot so its age shows it is stale.
                return
        # Stored only if the pod still has the address scraped: a page of its old address would
        # otherwise pass for fresh metrics of the new one.
        store.pod_update_metrics_if_exist(key, result.metrics, address=address, port=port)
