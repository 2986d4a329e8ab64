"""`Epp`: the whole endpoint picker in one object, for `epp.__main__` and for tests.

Built from a `ServerConfig` plus everything with side effects injected: the Prometheus registry, the
clock, the RNG, and either a `KubeClient` (production) or a controllers factory (tests seed the
datastore themselves). `start()` binds every port before returning, so `grpc_port`, `health_port`
and `metrics_port` are the real ones even when configured as 0. Every long-running piece is a
named task of one `Supervisor`; `stop()` cancels them all, stops the servers and closes what was
opened, in that order, and leaves no task, thread or listening socket behind.

Readiness is honest (STYLE habit 7): `wait_ready()` returns once the watches have synced and the pool
is known, which is also when gRPC health turns SERVING. With leader election
(`config.leader_election`, epp.k8s.leader) health is SERVING only while this replica holds the Lease;
every replica watches and probes all the same, so the next one takes over warm.

Two ways to end. `stop()` is immediate: tasks cancelled, streams in flight get `shutdown_grace`.
`drain()` is what SIGTERM does (DESIGN.md §4: a replica drains, NOT_SERVING first): gRPC health
turns NOT_SERVING at once while ext_proc keeps serving — watches, probes and routing all live — for
`config.shutdown_delay`, so that load balancers (Envoy's active health checks, the kubelet's
readiness probe and the EndpointSlice behind it) stop opening streams here; then the ext_proc server
stops accepting streams (HTTP/2 GOAWAY; a stream that still arrives is refused, which Envoy may
retry on another replica) and the streams in flight, which last as long as their responses, get
`config.shutdown_grace_period` to finish; `stop()` follows. Measured with Envoy 1.40 and two
replicas under 32 requests in flight (benchmarks/bench_epp_faults.py): no request fails. A second
`request_stop()` (a second SIGTERM or Ctrl-C) cuts the drain short.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import logging
import random
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Protocol

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry

from epp.api.types import NamespacedName
from epp.backend.metrics import Fetcher, MetricsFetcher, PodRefreshers, new_scrape_session
from epp.config import GRPCIO_TRANSPORT, ServerConfig
from epp.datastore import Datastore, new_datastore
from epp.h2 import GrpcServer
from epp.handlers import ExtProcServicer
from epp.handlers.accounting import Accounting
from epp.handlers.stream import PodScheduler
from epp.k8s import Controllers, KubeClient
from epp.k8s.controllers import WatchProgress
from epp.k8s.leader import LeaderElector, LeaseSettings
from epp.metrics import PoolCollector, RequestMetrics, TimedScheduler
from epp.scheduling import new_scheduler
from epp.server.health import HealthServicer
from epp.server.http import bind_socket, debug_app, metrics_app
from epp.server.supervisor import Supervisor
from epp.server.tls import KeyPair, server_key_pair, ssl_context

log = logging.getLogger(__name__)

# In-flight ext_proc streams get this long to finish when the EPP stops.
DEFAULT_SHUTDOWN_GRACE = 5.0
# How often wait_ready() looks again (the datastore has no "pool arrived" notification).
READY_POLL_INTERVAL = 0.02


class LeaderElectorLike(Protocol):
    """What the runner needs of `epp.k8s.leader.LeaderElector` (tests pass a fake)."""

    @property
    def is_leader(self) -> bool: ...

    async def run(self) -> None: ...

    async def release(self) -> None: ...


class ControllersLike(Protocol):
    """What the runner needs of `epp.k8s.Controllers`; tests pass a fake that seeds the datastore."""

    @property
    def has_synced(self) -> bool: ...

    async def run(self) -> None: ...

    def progress(self) -> Sequence[WatchProgress]:
        """Per watched kind, how far the watches and reconciles have got (the debug view shows it)."""
        ...


ControllersFactory = Callable[[Datastore], ControllersLike]


def build_info() -> tuple[str, str]:
    """(commit, build_ref) for `inference_extension_info`: no commit is recorded in the package,
    the build ref is its version."""
    try:
        return "", importlib.metadata.version("inference-epp")
    except importlib.metadata.PackageNotFoundError:
        return "", ""


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _grpc_options(extra: list[tuple[str, Any]] | None = None) -> list[tuple[str, Any]]:
    # No SO_REUSEPORT: a second EPP on the same port must fail to start, not silently share it.
    return [("grpc.so_reuseport", 0), *(extra or [])]


async def _serving() -> None:
    """The task that stands for a server while it serves (grpc and aiohttp run on their own callbacks).

    Stopping a server is a supervisor cleanup rather than a `finally` here: a task cancelled before
    its first step never runs its `finally`. Nor does this await grpc's `wait_for_termination()`:
    cancelling that wait cancels grpc's internal shutdown future and breaks the later `stop()`.
    """
    await asyncio.get_running_loop().create_future()


class Epp:
    def __init__(
        self,
        config: ServerConfig,
        *,
        registry: CollectorRegistry,
        kube_client: KubeClient | None = None,
        controllers: ControllersFactory | None = None,
        fetcher: Fetcher | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        leader_elector: LeaderElectorLike | None = None,
    ) -> None:
        if (kube_client is None) == (controllers is None):
            raise ValueError("give exactly one of kube_client and controllers")
        election = config.leader_election
        if leader_elector is None and election.enabled:
            if kube_client is None:
                raise ValueError("leader election needs a kube_client (or a leader_elector)")
            identity = election.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
            leader_elector = LeaderElector(
                kube_client,
                NamespacedName(config.pool_namespace, config.pool_name),
                LeaseSettings(
                    identity, election.lease_duration, election.renew_deadline, election.retry_period
                ),
            )
        self._elector = leader_elector
        self._config = config
        self._registry = registry
        if controllers is None:
            assert kube_client is not None
            client, pool_key = kube_client, NamespacedName(config.pool_namespace, config.pool_name)

            def watch_the_api(store: Datastore) -> ControllersLike:
                return Controllers(
                    client,
                    store,
                    pool_key,
                    bookmark_interval=config.watch.bookmark_interval,
                    pool_group=config.pool_group,
                )

            controllers = watch_the_api
        self._controllers_factory = controllers
        self._fetcher = fetcher
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._grace = shutdown_grace
        self._supervisor = Supervisor()
        self._datastore: Datastore | None = None
        self._controllers: ControllersLike | None = None
        self._ports: dict[str, int] = {}
        self._certificate: bytes | None = None
        self._started = False
        self._stopped = False
        self._stop_requested = False
        self._draining = False
        self._hurry = asyncio.Event()  # a second stop request: end the drain now
        self._ext_proc_server: Any = None

    # --- lifecycle -------------------------------------------------------------------------------
    async def __aenter__(self) -> Epp:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Bind and start everything; on any failure, undo what was started and re-raise."""
        if self._started:
            raise RuntimeError("an Epp starts once")
        self._started = True
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Cancel every task, stop the servers, close sessions, unregister metrics. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        await self._supervisor.stop()
        self._ext_proc_server = None  # a grpc server object keeps its poller thread alive
        log.info("endpoint picker stopped")

    async def wait(self) -> None:
        """Until `request_stop()` (returns) or a supervised task dies (raises TaskFailed)."""
        await self._supervisor.wait()

    def request_stop(self) -> None:
        """Signal-handler safe: wakes `wait()`; the caller then runs `drain()` or `stop()`.

        A second call while draining ends the drain at once (no more delay, streams cancelled).
        """
        if self._stop_requested:
            self._hurry.set()
            return
        self._stop_requested = True
        self._supervisor.request_stop()

    @property
    def draining(self) -> bool:
        """True from the start of `drain()`: gRPC health says NOT_SERVING."""
        return self._draining

    async def drain(self) -> None:
        """NOT_SERVING first, serve `shutdown_delay` more, refuse new streams, give those in flight
        `shutdown_grace_period`, then `stop()` (module docstring). Ends early if `request_stop()` is
        called again, or if a supervised task fails (then raises its `TaskFailed`)."""
        if not self._started or self._stopped:
            return
        config = self._config
        self._draining = True
        if self._elector is not None:
            # NOT_SERVING already; hand the Lease over now, so the next replica serves during our delay.
            await self._elector.release()
        log.info(
            "draining: health NOT_SERVING; still serving for %gs, then streams in flight get %gs",
            config.shutdown_delay,
            config.shutdown_grace_period,
        )
        if config.shutdown_delay > 0:
            delay = asyncio.ensure_future(asyncio.sleep(config.shutdown_delay))
            if not await self._until_hurried(delay):
                delay.cancel()
                await asyncio.gather(delay, return_exceptions=True)
        if self._supervisor.failure is None and not self._hurry.is_set():
            await self._finish_streams()
        await self.stop()
        if self._supervisor.failure is not None:
            raise self._supervisor.failure  # a task died while draining: not a clean exit

    async def _finish_streams(self) -> None:
        """Refuse new ext_proc streams and wait for those in flight (the grace period)."""
        server = self._ext_proc_server
        if server is None:
            return
        log.info("draining: refusing new ext_proc streams; waiting for those in flight")
        # grpc's stop(grace) must not be cancelled (that breaks its shutdown); a hurried drain
        # calls stop(None) beside it, which cancels the streams, and both return.
        graceful = asyncio.ensure_future(server.stop(self._config.shutdown_grace_period))
        if not await self._until_hurried(graceful):
            await server.stop(None)
        await graceful

    async def _until_hurried(self, work: asyncio.Future[Any]) -> bool:
        """Wait for `work`; False if a second stop request or a task failure came first."""
        hurry = asyncio.ensure_future(self._hurry.wait())
        failed = asyncio.ensure_future(self._supervisor.wait_failure())
        try:
            await asyncio.wait({work, hurry, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (hurry, failed):
                waiter.cancel()
            await asyncio.gather(hurry, failed, return_exceptions=True)
        if work.done():
            return True
        log.warning("draining cut short")
        return False

    async def wait_ready(self) -> None:
        """Until the watches have synced and the pool is known; raises if a task died meanwhile."""
        if not self._started:
            raise RuntimeError("not started")
        while True:
            if self._supervisor.failure is not None:
                raise self._supervisor.failure
            if self._stopped:
                raise RuntimeError("the endpoint picker was stopped before it became ready")
            controllers, store = self._controllers, self._datastore
            if (
                controllers is not None
                and store is not None
                and controllers.has_synced
                and store.pool_has_synced()
            ):
                return
            await asyncio.sleep(READY_POLL_INTERVAL)

    # --- what tests and the harness read ------------------------------------------------------------
    @property
    def datastore(self) -> Datastore:
        """The live store, for reading (tests/unit may also seed it)."""
        if self._datastore is None:
            raise RuntimeError("not started")
        return self._datastore

    @property
    def bind_address(self) -> str:
        return self._config.bind_address

    @property
    def grpc_port(self) -> int:
        return self._ports["grpc"]

    @property
    def health_port(self) -> int:
        return self._ports["health"]

    @property
    def metrics_port(self) -> int:
        return self._ports["metrics"]

    @property
    def debug_port(self) -> int:
        """The port of /debug/datastore, on `debug_address`."""
        return self._ports["debug"]

    @property
    def debug_address(self) -> str:
        return self._config.debug_bind_address

    @property
    def tls_certificate(self) -> bytes | None:
        """The ext_proc server's certificate (PEM) when serving TLS, e.g. to trust a self-signed one."""
        return self._certificate

    @property
    def task_names(self) -> frozenset[str]:
        return self._supervisor.task_names

    # --- wiring ------------------------------------------------------------------------------------
    async def _start(self) -> None:
        config, sup = self._config, self._supervisor
        loop = asyncio.get_running_loop()

        fetcher = self._fetcher
        if fetcher is None:
            session = new_scrape_session()
            sup.on_stop("scrape-session", session.close)
            prober = config.prober
            fetcher = MetricsFetcher(
                session,
                timeout=prober.scrape_timeout,
                scheme=prober.scheme,
                path=prober.path,
                insecure_skip_verify=prober.insecure_skip_verify,
            )
        refreshers = PodRefreshers(fetcher, config.prober, loop, self._clock)
        sup.on_stop("metrics-refreshers", refreshers.aclose)
        store = self._datastore = new_datastore(
            refreshers, prefix_capacity_per_pod=config.scheduler.prefix_capacity_per_pod
        )
        scheduling = config.scheduler
        accounting = Accounting(
            store,
            prefix_aware=scheduling.prefix_aware,
            block_chars=scheduling.prefix_block_chars,
            max_blocks=scheduling.prefix_max_blocks,
            clock=self._clock,
        )

        # Metric names follow the API generation: upstream v1.5's for v1, v0.3's for v1alpha2.
        request_metrics = RequestMetrics(self._registry, api_v1=config.api_v1, build=build_info())
        collectors = (*request_metrics.collectors(), PoolCollector(store, api_v1=config.api_v1))
        self._registry.register(collectors[-1])
        sup.on_stop("metrics-registry", lambda: self._unregister(collectors))

        scheduler: PodScheduler = new_scheduler(
            config.scheduler, self._rng, self._clock, pool_name=config.pool_name
        )
        if config.api_v1:
            scheduler = TimedScheduler(scheduler, request_metrics)
        servicer = ExtProcServicer(
            store,
            scheduler,
            request_metrics,
            destination_header_key=config.destination_endpoint_hint_key,
            metadata_namespace=config.destination_endpoint_hint_metadata_namespace,
            rng=self._rng,
            clock=self._clock,
            max_request_body_bytes=config.max_request_body_bytes,
            accounting=accounting,
            destination_fallbacks=config.destination_fallbacks,
            endpoint_subset_filter=config.endpoint_subset_filter,
            conformance=config.conformance,
        )
        # Registered before the ext_proc server, so it runs after the server has stopped (reverse
        # order): streams in their grace period may still be scanning a body.
        sup.on_stop("body-scanner", servicer.aclose)
        await self._start_ext_proc(servicer)
        elector = self._elector
        if elector is not None:
            # Cleanups run after every task has ended: the Lease is handed over on any stop.
            sup.on_stop("leader-election-release", elector.release)
            sup.spawn("leader-election", elector.run())
        await self._start_health(
            HealthServicer(
                lambda: (
                    not self._draining and store.pool_has_synced() and (elector is None or elector.is_leader)
                )
            )
        )
        metrics_address = config.metrics_bind_address or config.bind_address
        await self._start_http(
            "metrics-http", "metrics", metrics_app(self._registry), metrics_address, config.metrics_port
        )
        await self._start_http(
            "debug-http",
            "debug",
            debug_app(store, self._clock, self._watch_progress),
            config.debug_bind_address,
            config.debug_port,
        )

        controllers = self._controllers = self._controllers_factory(store)
        sup.spawn("controllers", controllers.run())
        log.info(
            "endpoint picker for pool %s/%s (%s): ext_proc %s (%s), health %s, metrics %s",
            config.pool_namespace,
            config.pool_name,
            config.pool_group,
            host_port(config.bind_address, self.grpc_port),
            "TLS" if config.secure_serving else "plaintext",
            host_port(config.bind_address, self.health_port),
            host_port(metrics_address, self.metrics_port),
        )
        log.info("datastore debug view on %s", host_port(config.debug_bind_address, self.debug_port))

    def _watch_progress(self) -> Sequence[WatchProgress]:
        # The metrics port serves before the controllers exist: no watches to report yet.
        return () if self._controllers is None else self._controllers.progress()

    async def _unregister(self, collectors: tuple[Any, ...]) -> None:
        for collector in collectors:
            self._registry.unregister(collector)

    async def _start_grpc(self, task: str, port_key: str, server: Any, port: int) -> None:
        try:
            if port == 0:  # older grpcio reports a failed bind this way instead of raising
                raise OSError(f"{task}: cannot listen on {self._config.bind_address}")
            self._ports[port_key] = port
            await server.start()
        except BaseException:
            await server.stop(None)
            raise
        grace = self._grace
        self._supervisor.on_stop(task, lambda: server.stop(grace))
        self._supervisor.spawn(task, _serving())

    async def _start_ext_proc(self, servicer: ExtProcServicer) -> None:
        config = self._config
        pair = server_key_pair(config.cert_path) if config.secure_serving else None
        if pair is not None:
            self._certificate = pair.cert_pem
        if config.ext_proc_transport == GRPCIO_TRANSPORT:
            await self._start_grpcio_ext_proc(servicer, pair)
            return
        limits = dataclasses.replace(config.h2, max_message_bytes=config.grpc_max_message_bytes)
        server = GrpcServer(limits=limits, ssl_context=None if pair is None else ssl_context(pair))
        servicer.add_to_h2_server(server)
        self._ports["grpc"] = await server.start(config.bind_address, config.grpc_port)
        self._ext_proc_server = server  # what the drain stops gracefully
        grace = self._grace
        self._supervisor.on_stop("grpc-ext-proc", lambda: server.stop(grace))
        self._supervisor.spawn("grpc-ext-proc", _serving())

    async def _start_grpcio_ext_proc(self, servicer: ExtProcServicer, pair: KeyPair | None) -> None:
        config = self._config
        size = config.grpc_max_message_bytes
        server = grpc.aio.server(
            options=_grpc_options(
                [("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)]
            )
        )
        servicer.add_to_server(server)
        address = host_port(config.bind_address, config.grpc_port)
        try:
            if pair is not None:
                credentials = grpc.ssl_server_credentials([(pair.key_pem, pair.cert_pem)])
                port = server.add_secure_port(address, credentials)
            else:
                port = server.add_insecure_port(address)
        except BaseException:
            await server.stop(None)
            raise
        await self._start_grpc("grpc-ext-proc", "grpc", server, port)
        self._ext_proc_server = server

    async def _start_health(self, health: HealthServicer) -> None:
        server = grpc.aio.server(options=_grpc_options())
        health.add_to_server(server)
        try:
            port = server.add_insecure_port(
                host_port(self._config.bind_address, self._config.grpc_health_port)
            )
        except BaseException:
            await server.stop(None)
            raise
        await self._start_grpc("grpc-health", "health", server, port)

    async def _start_http(self, task: str, port_key: str, app: web.Application, host: str, port: int) -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = None
        try:
            sock = bind_socket(host, port)
            self._ports[port_key] = sock.getsockname()[1]
            await web.SockSite(runner, sock).start()
        except BaseException:
            await runner.cleanup()
            if sock is not None:
                sock.close()
            raise
        self._supervisor.on_stop(task, runner.cleanup)
        self._supervisor.spawn(task, _serving())
