"""``NodeAgent``: kubelets for N nodes in one process, the way the harness's cluster runs pods.

It registers the nodes (``harness.cluster.nodes.NodeSet``: Ready, capacity, leases renewed like a kubelet's;
untainted, so any pod may land there), watches the pods the real scheduler binds to them (one
list+watch per node, ``fieldSelector=spec.nodeName=<node>`` across namespaces, as a kubelet does;
the EPP's own informer), and gives each pod a ``PodWorker`` (``harness.nodeagent.pod``).

It serves, on a loopback port of its own:

* ``/healthz``: 200 once the nodes are registered and schedulable, the watches listed and the
  container launcher is up; 503 before (the control plane waits for it);
* ``/debug/pods``: every pod it runs, with address, containers, pids, restart counts (JSON).

Given a container engine (``container_engine``: the directory of a running
``harness.cluster.container_engine.DockerEngine``, which its owner starts and stops), the agent runs
our images as real containers in it (``harness.nodeagent.containers``) and everything else as
processes; at the end it removes every container it created.

Every background task has this object as its owner (``_tasks``); ``run()`` returns only after all of
them are cancelled and every container process is gone. The launcher dying is fatal: ``run()``
raises ``LauncherGone`` and the process exits non-zero, so whoever supervises the agent notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from epp.k8s.client import PODS, KubeClient
from epp.k8s.config import load_kubeconfig
from epp.k8s.informer import DELETED, Informer, InformerEvent
from harness.base.addresses import AddressPool
from harness.cluster.container_engine import DockerEngine
from harness.nodeagent.api import PodApi
from harness.nodeagent.containers import ContainerLauncher
from harness.nodeagent.epp_image import AGENT_IMAGES
from harness.nodeagent.images import ImageMap
from harness.nodeagent.pod import AgentContext, BackoffPolicy, PodWorker
from harness.nodeagent.probes import Prober
from harness.nodeagent.runtime import Launcher, LauncherGone

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

NODE_AGENT_LABEL: Final = "epp-harness/node-agent"
DEFAULT_NODES: Final = 4
_EVENT_QUEUE: Final = 10_000


@dataclass(frozen=True)
class AgentSettings:
    kubeconfig: Path
    state_dir: Path
    nodes: int = DEFAULT_NODES
    health_port: int = 0
    host_ip: str = "127.0.0.1"
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    events: bool = True
    images: ImageMap = AGENT_IMAGES  # the defaults and the EPP's own image
    container_engine: Path | None = None  # run our images as containers in this engine


class NodeAgent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.node_names: list[str] = []
        self._workers: dict[str, PodWorker] = {}  # by pod UID; touched only on the loop
        self._tasks: set[asyncio.Task[Any]] = set()
        self._healthy = False
        self._events: asyncio.Queue[tuple[Mapping[str, Any], str, str, str, str, str]] = asyncio.Queue(
            _EVENT_QUEUE
        )
        self._addresses = AddressPool()
        self.health_url = ""

    # ---- the whole life -----------------------------------------------------------------------------
    async def run(self) -> None:
        settings = self.settings
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        config = load_kubeconfig(settings.kubeconfig)
        server = urllib.parse.urlsplit(config.server)
        api, client = PodApi(config), KubeClient(config)
        launcher = Launcher(settings.images.preload, settings.state_dir / "launcher.log")
        containers = (
            ContainerLauncher(DockerEngine.attach(settings.container_engine), str(settings.state_dir))
            if settings.container_engine is not None
            else None
        )
        prober = Prober()
        health = await self._serve_health()
        node_set = None
        try:
            log.info("starting: the container launcher and %d nodes, side by side", settings.nodes)
            registering = asyncio.ensure_future(asyncio.to_thread(self._register_nodes))
            try:
                await launcher.start()
                log.info("container launcher up (pid %s)", launcher.pid)
            finally:
                node_set = await registering  # (also when the launcher failed: its nodes must go)
            self.node_names = list(node_set.names)
            log.info("nodes registered and schedulable")
            ctx = AgentContext(
                api=api,
                launcher=launcher,
                images=settings.images,
                prober=prober,
                acquire_ip=self._addresses.acquire,
                release_ip=self._addresses.release,
                host_ip=settings.host_ip,
                api_server=(server.hostname or "127.0.0.1", str(server.port or 443)),
                state_dir=settings.state_dir,
                backoff=settings.backoff,
                record_event=self._record_event,
                spawn=self._spawn,
                forget=self._forget,
                containers=containers,
            )
            informers = [self._informer(client, ctx, name) for name in self.node_names]
            for informer in informers:
                self._spawn(informer.run(), f"watch {informer.field_selector}")
            if settings.events:
                self._spawn(self._send_events(api), "events")
            gone = self._spawn(launcher.wait_gone(), "launcher")
            await asyncio.wait(
                [asyncio.ensure_future(asyncio.gather(*(i.wait_synced() for i in informers))), gone],
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not launcher.alive:
                raise LauncherGone("the container launcher exited during start")
            self._healthy = True
            log.info("node agent ready: nodes %s, health %s", ", ".join(self.node_names), self.health_url)
            await gone
            raise LauncherGone("the container launcher exited")
        finally:
            self._healthy = False
            await launcher.close()  # every container process dies with it
            await self._cancel_tasks()
            if containers is not None:
                await containers.close()  # and every real container
            await prober.close()
            await client.close()
            await api.close()
            await health.cleanup()
            if node_set is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(node_set.stop)
            self._addresses.release_all()

    def _register_nodes(self) -> Any:
        from kubernetes import client, config

        from harness.cluster.nodes import NodeSet

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.settings.kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
        node_set = NodeSet(
            client.ApiClient(configuration),
            count=self.settings.nodes,
            taint=False,
            labels={NODE_AGENT_LABEL: "true"},
            internal_ip=self.settings.host_ip,
        )
        node_set.start()
        return node_set

    def _informer(self, client: KubeClient, ctx: AgentContext, node: str) -> Informer[JsonObject]:
        informer: Informer[JsonObject] = Informer(
            client, PODS, "", lambda raw: dict(raw), field_selector=f"spec.nodeName={node}"
        )
        informer.add_handler(lambda event: self._on_pod(ctx, node, event))
        return informer

    # ---- pods ---------------------------------------------------------------------------------------
    def _on_pod(self, ctx: AgentContext, node: str, event: InformerEvent[JsonObject]) -> None:
        pod = event.obj
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        worker = self._workers.get(uid)
        if event.type == DELETED:
            if worker is not None:
                worker.removed()
            return
        if worker is not None:
            worker.observe(pod)
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return  # finished before this agent saw it: nothing to run
        for other in self._workers.values():  # same name, new UID: the old one is gone
            if other.key == f"{event.key.namespace}/{event.key.name}":
                other.removed()
        worker = PodWorker(ctx, pod, node)
        self._workers[uid] = worker
        worker.start()

    def _forget(self, worker: PodWorker) -> None:
        if self._workers.get(worker.uid) is worker:
            del self._workers[worker.uid]

    def describe(self) -> JsonObject:
        return {
            "nodes": self.node_names,
            "healthy": self._healthy,
            "pods": [w.describe() for w in self._workers.values()],
        }

    # ---- owned tasks --------------------------------------------------------------------------------
    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _cancel_tasks(self) -> None:
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- events -------------------------------------------------------------------------------------
    def _record_event(
        self, pod: Mapping[str, Any], node: str, kind: str, reason: str, message: str, field_path: str
    ) -> None:
        if self.settings.events:
            with contextlib.suppress(asyncio.QueueFull):  # events are best effort, as a kubelet's are
                self._events.put_nowait((pod, node, kind, reason, message, field_path))

    async def _send_events(self, api: PodApi) -> None:
        while True:
            pod, node, kind, reason, message, field_path = await self._events.get()
            await api.event(pod, node, kind, reason, message, field_path)

    # ---- health and debug ---------------------------------------------------------------------------
    async def _serve_health(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/debug/pods", self._debug_pods)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.settings.health_port)
        await site.start()
        port = runner.addresses[0][1]
        self.health_url = f"http://127.0.0.1:{port}"
        return runner

    async def _healthz(self, request: web.Request) -> web.Response:
        if self._healthy:
            return web.Response(text="ok")
        return web.Response(status=503, text="starting")

    async def _debug_pods(self, request: web.Request) -> web.Response:
        return web.json_response(self.describe())
