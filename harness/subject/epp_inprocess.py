"""The real EPP, in this process, on its own event loop thread: the integration suite's system under test.

Tests are synchronous and drive the API server with blocking calls; running the EPP on a separate
loop keeps those calls from stalling its watches and probers. Everything a test learns about the EPP
goes through the same doors production uses: ext_proc over gRPC, gRPC health, `/metrics` and the
read-only `/debug/datastore` view. The datastore object itself is never handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from epp.api.types import NamespacedName
from epp.config import (
    DEFAULT_SCHEDULER,
    DEFAULT_WATCH_BOOKMARK_INTERVAL,
    ProberConfig,
    ServerConfig,
    WatchConfig,
)
from epp.k8s.client import KubeClient
from epp.k8s.config import load_kubeconfig
from epp.k8s.controllers import Controllers, Reconcilers
from epp.server.runner import Epp
from harness.cluster.releases import session_generation
from harness.dataplane.extproc_client import ExtProcClient
from harness.subject import epp_probe

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class EppSettings:
    pool_name: str
    pool_namespace: str
    kubeconfig: Path
    refresh_interval: float = 0.05
    staleness_threshold: float = 2.0
    scheduler: str = DEFAULT_SCHEDULER  # "filter-tree" or "scorer" (the EPP's --scheduler)
    # The EPP's --watchBookmarkInterval: fault tests shorten it to see dead watches replaced in seconds.
    watch_bookmark_interval: float = DEFAULT_WATCH_BOOKMARK_INTERVAL
    # The EPP's --pool-group: the generation of the CRDs the harness installs (the session's).
    pool_group: str = field(default_factory=lambda: session_generation().pool_group)


class EppInProcess:
    """Start/stop the EPP on a private loop thread; `restart()` models a pod restart (fresh memory).

    `reconcilers` builds a deliberately different EPP (a delayed or defective reconcile, to prove
    that a test would notice): it is handed to the controllers' constructor, never branched on.
    """

    def __init__(self, settings: EppSettings, *, reconcilers: Reconcilers | None = None) -> None:
        self.settings = settings
        self._reconcilers = reconcilers
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._done: Future[None] | None = None
        self._ports: dict[str, int] = {}
        self._client: ExtProcClient | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30.0) -> None:
        started: Future[None] = Future()
        self._done = Future()
        self._thread = threading.Thread(
            target=self._run_thread, args=(started,), name=f"epp-{self.settings.pool_name}", daemon=True
        )
        self._thread.start()
        try:
            started.result(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 30.0) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            # The loop may already have finished (a failed start) between the check and the call.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("the EPP thread did not stop in time")
            self._thread = None
        done, self._done = self._done, None
        if done is not None and done.done() and done.exception() is not None:
            raise RuntimeError("the EPP failed while running") from done.exception()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> EppInProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _config(self) -> ServerConfig:
        s = self.settings
        base = ServerConfig(
            pool_name=s.pool_name,
            pool_namespace=s.pool_namespace,
            pool_group=s.pool_group,
            grpc_port=0,
            grpc_health_port=0,
            metrics_port=0,
            debug_port=0,
            bind_address=LOOPBACK,
            secure_serving=False,
            kubeconfig=str(s.kubeconfig),
        )
        return replace(
            base,
            prober=ProberConfig(refresh_interval=s.refresh_interval),
            scheduler=replace(
                base.scheduler, metrics_staleness_threshold=s.staleness_threshold, kind=s.scheduler
            ),
            watch=WatchConfig(bookmark_interval=s.watch_bookmark_interval),
        )

    def _run_thread(self, started: Future[None]) -> None:
        assert self._done is not None
        try:
            asyncio.run(self._main(started))
            self._done.set_result(None)
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            self._done.set_exception(exc)

    async def _main(self, started: Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        config = self._config()
        async with KubeClient(load_kubeconfig(config.kubeconfig)) as client:
            epp = self._epp(config, client)
            await epp.start()
            try:
                self._ports = {
                    "grpc": epp.grpc_port,
                    "health": epp.health_port,
                    "metrics": epp.metrics_port,
                    "debug": epp.debug_port,
                }
                started.set_result(None)
                stop_wait = asyncio.ensure_future(self._stop.wait())
                epp_wait = asyncio.ensure_future(epp.wait())
                try:
                    await asyncio.wait({stop_wait, epp_wait}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for fut in (stop_wait, epp_wait):
                        fut.cancel()
                    await asyncio.gather(stop_wait, epp_wait, return_exceptions=True)
                if epp_wait.done() and not epp_wait.cancelled() and epp_wait.exception() is not None:
                    raise RuntimeError("a supervised EPP task failed") from epp_wait.exception()
            finally:
                await epp.stop()
        self._loop = None

    def _epp(self, config: ServerConfig, client: KubeClient) -> Epp:
        reconcilers = self._reconcilers
        if reconcilers is None:  # exactly the production wiring
            return Epp(config, registry=CollectorRegistry(), kube_client=client)
        pool = NamespacedName(config.pool_namespace, config.pool_name)
        return Epp(
            config,
            registry=CollectorRegistry(),
            controllers=lambda store: Controllers(
                client,
                store,
                pool,
                pool_group=config.pool_group,
                reconcilers=reconcilers,
                bookmark_interval=config.watch.bookmark_interval,
            ),
        )

    # ------------------------------------------------------------------ what tests read
    @property
    def grpc_target(self) -> str:
        return f"{LOOPBACK}:{self._ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self._ports['metrics']}"

    def ext_proc(self) -> ExtProcClient:
        """A shared client for this EPP's ext_proc port (closed at stop)."""
        if self._client is None:
            self._client = ExtProcClient(self.grpc_target)
        return self._client

    @property
    def debug_url(self) -> str:
        """Base URL of the EPP's /debug/datastore listener."""
        return f"http://{LOOPBACK}:{self._ports['debug']}"

    def datastore_view(self) -> dict[str, Any]:
        return epp_probe.datastore_view(self.debug_url)

    def metrics_text(self) -> str:
        return epp_probe.metrics_text(self.metrics_url)

    def health(self, service: str = "") -> str:
        return epp_probe.health(f"{LOOPBACK}:{self._ports['health']}", service)
