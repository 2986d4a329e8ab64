"""One pod on one node, from binding to its final delete: what a kubelet's pod worker does.

``PodWorker`` owns the pod: its address (the "sandbox"), one ``ContainerWorker`` per container, and
every status write. ``ContainerWorker`` owns one container's process: it starts it through the
launcher, runs its probes, restarts it per ``restartPolicy`` with a crash-loop backoff, and stops it.

The lifecycle, as a kubelet runs it:

1. Bound to our node: an address is taken from the loopback range, status says Pending with the
   pod IP; each container's image is looked up in the image map (unknown: ``ErrImagePull`` then
   ``ImagePullBackOff``, the pod stays Pending) and its process started; status says Running.
2. Ready follows the readiness probes (a container without one is ready once running); a liveness
   or startup probe that fails its threshold restarts the container; a process that exits is
   restarted per ``restartPolicy`` (first at once, then after a backoff that doubles up to a cap),
   ``restartCount`` counting the restarts.
3. ``deletionTimestamp`` set (``kubectl delete``, a scale-down, a namespace deletion): nothing
   changes at first — the pod stays Ready while each container's ``preStop`` hook runs (the window in
   which upstream's EPP still routed to terminating pods) — then SIGTERM, Ready=False written, up to
   ``deletionGracePeriodSeconds`` for the processes to exit, SIGKILL for the rest, the terminated
   statuses written, and the pod deleted with grace period 0 (UID precondition).
4. Deleted outright (force delete): processes get SIGTERM and at most ``FORCED_STOP_S`` to exit; no
   more writes. Either way the address is released and the processes are gone when the worker ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import aiohttp

from harness.cluster.container_engine import DockerCommandError
from harness.nodeagent import probes
from harness.nodeagent.api import ApiFailed, PodApi, PodGone
from harness.nodeagent.containers import ContainerLauncher, ContainerRun, ContainerRuntime
from harness.nodeagent.images import ContainerConfigError, ImageMap, LaunchContext, Runtime, image_id
from harness.nodeagent.runtime import (
    Command,
    Executable,
    ExitStatus,
    Launcher,
    LauncherGone,
    Process,
    StartFailed,
)
from harness.nodeagent.status import Conditions, ContainerStatus, pod_status

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

FORCED_STOP_S: Final = 2.0
"""How long processes of a pod deleted outright (grace 0, --force) get between SIGTERM and SIGKILL."""
DEFAULT_GRACE_S: Final = 30
UNHEALTHY_EVENT_INTERVAL_S: Final = 10.0
_VARIABLE: Final = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(frozen=True)
class BackoffPolicy:
    """Crash-loop backoff: the first restart at once, then ``initial`` doubling up to ``maximum``.

    A kubelet uses 10 s and 300 s; the agent defaults to much less so tests see restarts quickly.
    A container that ran for ``2 * maximum`` before it stopped starts over at no delay.
    """

    initial: float = 0.5
    maximum: float = 5.0


class Backoff:
    def __init__(self, policy: BackoffPolicy) -> None:
        self._policy = policy
        self._next = 0.0

    def next(self, ran_for: float = 0.0) -> float:
        if ran_for > 2 * self._policy.maximum:
            self._next = 0.0
        delay = self._next
        self._next = self._policy.initial if delay == 0 else min(delay * 2, self._policy.maximum)
        return delay


@dataclass
class AgentContext:
    """What every pod worker shares (owned by ``harness.nodeagent.agent.NodeAgent``)."""

    api: PodApi
    launcher: Launcher
    images: ImageMap
    prober: probes.Prober
    acquire_ip: Callable[[], str]
    release_ip: Callable[[str], None]
    host_ip: str
    api_server: tuple[str, str]  # host, port: the containers' KUBERNETES_SERVICE_HOST/PORT
    state_dir: Path
    backoff: BackoffPolicy
    record_event: Callable[
        [Mapping[str, Any], str, str, str, str, str], None
    ]  # pod, node, type, reason, msg, field
    spawn: Callable[[Awaitable[None], str], asyncio.Task[None]]  # an owned background task
    forget: Callable[[PodWorker], None]
    # Runs our images as real containers (harness.nodeagent.containers); None: processes only.
    containers: ContainerLauncher | None = None


def now() -> datetime:
    return datetime.now(UTC)


class PodWorker:
    def __init__(self, ctx: AgentContext, pod: JsonObject, node: str) -> None:
        meta = pod["metadata"]
        self.ctx = ctx
        self.node = node
        self.uid = str(meta["uid"])
        self.namespace = str(meta["namespace"])
        self.name = str(meta["name"])
        self.pod = pod
        spec = pod.get("spec") or {}
        self.restart_policy = str(spec.get("restartPolicy") or "Always")
        self.host_network = bool(spec.get("hostNetwork"))
        self.ip: str | None = None
        self.start_time = now()
        self.terminal = False
        self.conditions = Conditions()
        self.workdir = ctx.state_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid}"
        self.containers = [ContainerWorker(self, c) for c in spec.get("containers") or ()]
        self._deleting = asyncio.Event()
        self._gone = asyncio.Event()
        self._status_lock = asyncio.Lock()
        self._written: JsonObject | None = None
        self._task: asyncio.Task[None] | None = None
        self._alongside: list[asyncio.Task[None]] = []  # e.g. token renewals; cancelled at the end
        self.observe(pod)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def gone(self) -> bool:
        return self._gone.is_set()

    def start(self) -> None:
        self._task = self.ctx.spawn(self.run(), f"pod {self.key}")

    def observe(self, pod: JsonObject) -> None:
        """A newer version of the pod from the watch."""
        self.pod = pod
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            self._deleting.set()

    def removed(self) -> None:
        """The pod is gone from the API (deleted outright, or the final delete went through)."""
        self._gone.set()
        self._deleting.set()

    def run_alongside(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` until this pod's worker ends (what a kubelet does per pod: token renewal)."""
        self._alongside.append(self.ctx.spawn(work, f"{name} {self.key}"))

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    # ---- the lifecycle ---------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._run()
        except PodGone:
            log.info("pod %s (%s) is gone", self.key, self.uid)
        except (LauncherGone, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("pod %s failed", self.key)
        finally:
            try:
                await asyncio.shield(self._stop_everything())
            finally:
                for task in self._alongside:
                    task.cancel()
                await asyncio.gather(*self._alongside, return_exceptions=True)
                if self.ip is not None and not self.host_network:
                    self.ctx.release_ip(self.ip)
                self.ctx.forget(self)

    async def _run(self) -> None:
        if self._deleting.is_set() and not any(c.status.ever_ran for c in self.containers):
            # Deleted before it ever ran here: nothing to stop, only the final delete.
            if not self.gone:
                await self.ctx.api.delete_pod(self.namespace, self.name, self.uid)
            return
        self.ip = self.ctx.host_ip if self.host_network else self.ctx.acquire_ip()
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self.sync_status()
        for container in self.containers:
            container.start()
        await self._deleting.wait()
        await self._terminate()

    async def _terminate(self) -> None:
        grace = self._grace_period()
        deadline = time.monotonic() + (min(grace, FORCED_STOP_S) if self.gone else grace)
        await asyncio.gather(*(c.stop(deadline) for c in self.containers))
        if self.gone:
            return
        self.terminal = True
        await self.sync_status()
        await self.ctx.api.delete_pod(self.namespace, self.name, self.uid)

    def _grace_period(self) -> float:
        meta, spec = self.pod.get("metadata") or {}, self.pod.get("spec") or {}
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        return float(grace)

    async def _stop_everything(self) -> None:
        """Whatever happened: no process of this pod outlives its worker."""
        deadline = time.monotonic() + FORCED_STOP_S
        await asyncio.gather(
            *(c.stop(deadline, graceful=False) for c in self.containers), return_exceptions=True
        )

    async def wait_gone(self) -> None:
        await self._gone.wait()

    # ---- status ------------------------------------------------------------------------------------
    async def sync_status(self) -> None:
        """Write the status if it changed since the last write (writes are serialised, in order)."""
        if self.gone:
            return
        async with self._status_lock:
            status = pod_status(
                containers=[c.status for c in self.containers],
                restart_policy=self.restart_policy,
                pod_ip=self.ip,
                host_ip=self.ctx.host_ip,
                start_time=self.start_time,
                conditions=self.conditions,
                now=now(),
                terminal=self.terminal,
            )
            if status == self._written or self.gone:
                return
            try:
                await self.ctx.api.patch_status(self.namespace, self.name, self.uid, status)
            except PodGone:
                self.removed()
                return
            except (ApiFailed, aiohttp.ClientError, TimeoutError) as exc:
                # Not fatal (a kubelet keeps going): the next change writes the whole status again.
                log.error("pod %s: status not written: %r", self.key, exc)
                return
            self._written = status

    def event(self, kind: str, reason: str, message: str, container: str = "") -> None:
        field = f"spec.containers{{{container}}}" if container else ""
        self.ctx.record_event(self.pod, self.node, kind, reason, message, field)

    def describe(self) -> JsonObject:
        """For the agent's ``/debug/pods``."""
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "node": self.node,
            "ip": self.ip,
            "workdir": str(self.workdir),  # its containers' logs and projected files
            "deleting": self._deleting.is_set(),
            "containers": [c.describe() for c in self.containers],
        }


class ContainerWorker:
    def __init__(self, pod: PodWorker, spec: Mapping[str, Any]) -> None:
        self.pod = pod
        self.spec = spec
        self.name = str(spec.get("name", ""))
        self.image = str(spec.get("image", ""))
        self.status = ContainerStatus(self.name, self.image)
        self.process: Process | None = None
        self._backoff = Backoff(pod.ctx.backoff)
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._deadline = 0.0
        self._graceful = True
        self._restart = asyncio.Event()  # set by a failed liveness/startup probe
        self._restart_reason = ""

    def start(self) -> None:
        self._task = self.pod.ctx.spawn(self.run(), f"container {self.pod.key}/{self.name}")

    async def stop(self, deadline: float, graceful: bool = True) -> None:
        """Stop the container (preStop, SIGTERM, until ``deadline``, SIGKILL) and wait until it is down."""
        if not self._stop.is_set():
            self._deadline, self._graceful = deadline, graceful
            self._stop.set()
        elif not graceful:
            self._graceful = False
            self._deadline = min(self._deadline, deadline)
        if self._task is not None:
            await asyncio.shield(self._task)

    def describe(self) -> JsonObject:
        return {
            "name": self.name,
            "image": self.image,
            "pid": self.process.pid if self.process is not None and not self.process.exited.done() else None,
            "state": self.status.state,
            "reason": self.status.reason,
            "ready": self.status.ready,
            "restartCount": self.status.restart_count,
        }

    # ---- the container's life ------------------------------------------------------------------------
    async def _runtime(self) -> Runtime | ContainerRuntime | None:
        """A real container for our images when the agent has an engine, else the image map's process."""
        ctx = self.pod.ctx
        if ctx.containers is not None:
            try:
                runtime = await ctx.containers.runtime_for(self.image)
            except DockerCommandError as exc:
                log.error("%s/%s: the container engine failed: %s", self.pod.key, self.name, exc)
            else:
                if runtime is not None:
                    return runtime
        return ctx.images.resolve(self.image)

    async def run(self) -> None:
        runtime = await self._runtime()
        if runtime is None:
            await self._image_pull_failure()
            return
        try:
            command: Command | ContainerRun = await runtime.prepare(self.spec, self._launch_context())
            env = container_env(self.spec, self.pod)
            if isinstance(command, Executable) and command.env:
                env = {**dict(command.env), **env}
            if isinstance(command, ContainerRun) and not _sets(self.spec, "PATH"):
                env.pop("PATH")  # not the agent's: the image's own PATH applies in a container
            command = expand_command(command, env)
            annotations = (self.pod.pod.get("metadata") or {}).get("annotations") or {}
            readiness = probes.parse(self.spec.get("readinessProbe"), self.spec, annotations)
            liveness = probes.parse(self.spec.get("livenessProbe"), self.spec, annotations)
            startup = probes.parse(self.spec.get("startupProbe"), self.spec, annotations)
        except (ContainerConfigError, probes.ProbeConfigError) as exc:
            self.status.waiting("CreateContainerConfigError", str(exc))
            self.pod.event("Warning", "Failed", f"Error: {exc}", self.name)
            await self.pod.sync_status()
            await self._stop.wait()
            return
        self.status.image_id = (
            f"docker://{command.image.id}" if isinstance(command, ContainerRun) else image_id(self.image)
        )
        self.pod.event(
            "Normal", "Pulled", f'Container image "{self.image}" already present on machine', self.name
        )
        while not self._stop.is_set():
            began = time.monotonic()
            stopped = await self._run_once(command, env, readiness, liveness, startup)
            if stopped or self._stop.is_set():
                return
            if not self._restarts():
                await self.pod.sync_status()
                await self._stop.wait()
                return
            delay = self._backoff.next(time.monotonic() - began)
            if delay > 0:
                self.status.keep_as_last()
                self.status.waiting(
                    "CrashLoopBackOff",
                    f"back-off {delay:g}s restarting failed container={self.name} pod={self.pod.name}",
                )
                self.pod.event("Warning", "BackOff", "Back-off restarting failed container", self.name)
                await self.pod.sync_status()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
            else:
                self.status.keep_as_last()

    def _restarts(self) -> bool:
        if self.pod.restart_policy == "Always":
            return True
        if self.pod.restart_policy == "OnFailure":
            return self.status.exit_code != 0 or self._restart_reason != ""
        return False

    async def _run_once(
        self,
        command: Command | ContainerRun,
        env: Mapping[str, str],
        readiness: probes.Probe | None,
        liveness: probes.Probe | None,
        startup: probes.Probe | None,
    ) -> bool:
        """One process from start to exit; True if it ended because the container is being stopped."""
        ctx = self.pod.ctx
        first = not self.status.ever_ran
        log_file = self.pod.workdir / f"{self.name}.log"
        try:
            if isinstance(command, ContainerRun):
                assert ctx.containers is not None
                process = await ctx.containers.run(command, env=env, log_file=log_file, pod_uid=self.pod.uid)
            else:
                process = await ctx.launcher.run(command, env=env, log_file=log_file, cwd=self.pod.workdir)
        except StartFailed as exc:
            self.status.terminated(128, None, "StartError", now())
            self.status.message = str(exc)
            self.pod.event("Warning", "Failed", f"Error: {exc}", self.name)
            await self.pod.sync_status()
            return False
        self.process = process
        if not first:
            self.status.restart_count += 1
        container_id = f"docker://{process.container_id}" if process.container_id else ""
        self.status.running(container_id or f"harness://{secrets.token_hex(32)}", now())
        self.status.started = startup is None
        self.status.ready = readiness is None and self.status.started
        self._restart.clear()
        self._restart_reason = ""
        self.pod.event("Normal", "Created", f"Created container: {self.name}", self.name)
        self.pod.event("Normal", "Started", f"Started container {self.name}", self.name)
        await self.pod.sync_status()
        probers = [
            ctx.spawn(self._probe_loop(p, role), f"{role} probe {self.pod.key}/{self.name}")
            for p, role in ((startup, "startup"), (readiness, "readiness"), (liveness, "liveness"))
            if p is not None
        ]
        try:
            exited = asyncio.ensure_future(asyncio.shield(process.exited))
            stop = asyncio.ensure_future(self._stop.wait())
            restart = asyncio.ensure_future(self._restart.wait())
            try:
                await asyncio.wait((exited, stop, restart), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in (exited, stop, restart):
                    waiter.cancel()
        finally:
            for task in probers:
                task.cancel()
            await asyncio.gather(*probers, return_exceptions=True)
        if self._stop.is_set():
            await self._terminate(process, pre_stop=self._graceful, deadline=self._deadline)
            return True
        if self._restart.is_set() and not process.exited.done():
            why = f"Container {self.name} {self._restart_reason}, will be restarted"
            self.pod.event("Normal", "Killing", why, self.name)
            grace = float(
                (self.pod.pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
            )
            await self._terminate(process, pre_stop=True, deadline=time.monotonic() + grace)
            return False
        self._exited(await process.exited)
        await self.pod.sync_status()
        return False

    def _exited(self, status: ExitStatus) -> None:
        code = status.container_exit_code
        reason = status.reason or ("Completed" if code == 0 else "Error")
        self.status.terminated(code, status.signal, reason, now())

    async def _signal(self, process: Process, sig: signal.Signals) -> None:
        """SIGTERM/SIGKILL through whichever runtime started the process."""
        ctx = self.pod.ctx
        if process.container_id and ctx.containers is not None:
            await ctx.containers.signal(process, sig)
            return
        with contextlib.suppress(LauncherGone):
            await ctx.launcher.signal(process, sig)

    async def _terminate(self, process: Process, *, pre_stop: bool, deadline: float) -> None:
        """preStop (graceful only), SIGTERM, Ready=False written, wait until ``deadline``, SIGKILL."""
        if pre_stop and not self.pod.gone:
            await self._pre_stop(deadline)
        if not process.exited.done():
            self.pod.event("Normal", "Killing", f"Stopping container {self.name}", self.name)
            await self._signal(process, signal.SIGTERM)
        self.status.ready = False
        self.status.started = False
        await self.pod.sync_status()
        remaining = deadline - time.monotonic()
        if remaining > 0 and not process.exited.done():
            gone = asyncio.ensure_future(self.pod.wait_gone()) if self._graceful else None
            waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(asyncio.shield(process.exited))}
            if gone is not None:
                waits.add(gone)
            done, pending = await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()
            if gone is not None and gone in done and not process.exited.done():
                # deleted outright meanwhile: only a short grace is left
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(process.exited), FORCED_STOP_S)
        if not process.exited.done():
            await self._signal(process, signal.SIGKILL)
        self._exited(await process.exited)

    async def _pre_stop(self, deadline: float) -> None:
        hook = ((self.spec.get("lifecycle") or {}).get("preStop")) or {}
        if not hook:
            return
        remaining = deadline - time.monotonic()
        try:
            await asyncio.wait_for(self._run_hook(hook), timeout=max(0.0, remaining))
        except TimeoutError:
            log.info("%s/%s: preStop hook cut short by the grace period", self.pod.key, self.name)

    async def _run_hook(self, hook: Mapping[str, Any]) -> None:
        """``sleep: {seconds}``, ``exec`` of ``sleep N`` (the usual drain), or ``httpGet``; ends early if the
        pod is deleted outright."""
        seconds = _hook_sleep_seconds(hook)
        if seconds is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pod.wait_gone(), seconds)
            return
        if "httpGet" in hook:
            probe = probes.parse({"httpGet": hook["httpGet"], "timeoutSeconds": 30}, self.spec, {})
            if probe is not None and self.pod.ip is not None:
                await self.pod.ctx.prober.check(probe, self.pod.ip)
            return
        self.pod.event(
            "Warning", "FailedPreStopHook", "the harness node agent runs only sleep hooks", self.name
        )

    async def _probe_loop(self, probe: probes.Probe, role: str) -> None:
        ctx, pod = self.pod.ctx, self.pod
        await asyncio.sleep(probe.initial_delay)
        successes = failures = 0
        last_event = 0.0
        next_at = time.monotonic()
        while True:
            if role != "startup" and not self.status.started:
                next_at = await _tick(next_at, probe.period)
                continue
            result = await ctx.prober.check(probe, pod.ip or "")
            if result.ok:
                successes, failures = successes + 1, 0
            else:
                successes, failures = 0, failures + 1
                if time.monotonic() - last_event > UNHEALTHY_EVENT_INTERVAL_S:
                    last_event = time.monotonic()
                    pod.event(
                        "Warning",
                        "Unhealthy",
                        f"{role.capitalize()} probe failed: {result.detail}",
                        self.name,
                    )
            if role == "readiness":
                if result.ok and successes >= probe.success_threshold and not self.status.ready:
                    self.status.ready = True
                    await pod.sync_status()
                elif not result.ok and failures >= probe.failure_threshold and self.status.ready:
                    self.status.ready = False
                    await pod.sync_status()
            elif role == "startup":
                if result.ok:
                    self.status.started = True
                    await pod.sync_status()
                    return
                if failures >= probe.failure_threshold:
                    self._restart_reason = "failed startup probe"
                    self._restart.set()
                    return
            elif not result.ok and failures >= probe.failure_threshold:
                self._restart_reason = "failed liveness probe"
                self._restart.set()
                return
            next_at = await _tick(next_at, probe.period)

    async def _image_pull_failure(self) -> None:
        """An unknown image: ErrImagePull, then ImagePullBackOff, retried with a backoff until stopped."""
        known = self.pod.ctx.images.known()
        pull = (f'failed to pull and unpack image "{self.image}": not found (the harness node agent runs '
                f"only these images: {known})")  # fmt: skip
        backoff = Backoff(self.pod.ctx.backoff)
        backoff.next()
        while not self._stop.is_set():
            self.status.waiting("ErrImagePull", pull)
            self.pod.event("Warning", "Failed", f'Failed to pull image "{self.image}": {pull}', self.name)
            await self.pod.sync_status()
            if await self._stopped_within(backoff.next()):
                return
            self.status.waiting(
                "ImagePullBackOff", f'Back-off pulling image "{self.image}": ErrImagePull: {pull}'
            )
            self.pod.event("Normal", "BackOff", f'Back-off pulling image "{self.image}"', self.name)
            await self.pod.sync_status()
            if await self._stopped_within(backoff.next()):
                return

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def _launch_context(self) -> LaunchContext:
        ctx = self.pod.ctx
        return LaunchContext(
            pod=self.pod.pod,
            pod_ip=self.pod.ip or "",
            workdir=self.pod.workdir,
            api_server_host=ctx.api_server[0],
            api_server_port=ctx.api_server[1],
            api=ctx.api,
            run_alongside=self.pod.run_alongside,
        )


async def _tick(next_at: float, period: float) -> float:
    """Sleep until the next probe time (period measured start to start, as a kubelet's ticker)."""
    next_at += period
    delay = next_at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    else:
        next_at = time.monotonic()
    return next_at


def _hook_sleep_seconds(hook: Mapping[str, Any]) -> float | None:
    """The duration of a ``sleep`` hook, or of an ``exec`` hook that only runs ``sleep N``."""
    if "sleep" in hook:
        return float((hook["sleep"] or {}).get("seconds", 0))
    command = [str(c) for c in ((hook.get("exec") or {}).get("command") or ())]
    if command and command[0] in ("/bin/sh", "sh", "/bin/bash", "bash") and "-c" in command[1:2]:
        command = command[2].split() if len(command) > 2 else []
    if len(command) == 2 and os.path.basename(command[0]) == "sleep":
        try:
            return float(command[1])
        except ValueError:
            return None
    return None


# ---- the container's environment -----------------------------------------------------------------------

_FIELD_PATHS: Final[Mapping[str, Callable[[Mapping[str, Any], PodWorker], str]]] = {
    "metadata.name": lambda pod, w: w.name,
    "metadata.namespace": lambda pod, w: w.namespace,
    "metadata.uid": lambda pod, w: w.uid,
    "spec.nodeName": lambda pod, w: w.node,
    "spec.serviceAccountName": lambda pod, w: str((pod.get("spec") or {}).get("serviceAccountName", "")),
    "status.podIP": lambda pod, w: w.ip or "",
    "status.podIPs": lambda pod, w: w.ip or "",
    "status.hostIP": lambda pod, w: w.ctx.host_ip,
    "status.hostIPs": lambda pod, w: w.ctx.host_ip,
}
_LABEL_REF: Final = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def container_env(spec: Mapping[str, Any], worker: PodWorker) -> dict[str, str]:
    """The process environment: what a kubelet injects, then the container's ``env`` in order."""
    host, port = worker.ctx.api_server
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOSTNAME": worker.name,
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
        "KUBERNETES_SERVICE_PORT_HTTPS": port,
        "EPP_HARNESS_POD_IP": worker.ip or "",
    }
    if spec.get("envFrom"):
        raise ContainerConfigError("envFrom (ConfigMaps, Secrets) is not supported by the harness node agent")
    for entry in spec.get("env") or ():
        name = str(entry.get("name", ""))
        if "value" in entry or "valueFrom" not in entry:
            env[name] = expand(str(entry.get("value", "")), env)
            continue
        source = entry["valueFrom"] or {}
        if "fieldRef" not in source:
            raise ContainerConfigError(
                f"env {name}: only value and fieldRef are supported by the harness node agent"
            )
        path = str(source["fieldRef"].get("fieldPath", ""))
        getter = _FIELD_PATHS.get(path)
        if getter is not None:
            env[name] = getter(worker.pod, worker)
            continue
        match = _LABEL_REF.match(path)
        if match is None:
            raise ContainerConfigError(f"env {name}: unsupported fieldPath {path!r}")
        section = (worker.pod.get("metadata") or {}).get(match[1]) or {}
        env[name] = str(section.get(match[2], ""))
    return env


def _sets(spec: Mapping[str, Any], variable: str) -> bool:
    return any(entry.get("name") == variable for entry in spec.get("env") or ())


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` is a literal ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _VARIABLE.sub(replace, text)


def expand_command(command: Command | ContainerRun, env: Mapping[str, str]) -> Command | ContainerRun:
    expanded = dataclasses.replace(command, argv=tuple(expand(a, env) for a in command.argv))
    if isinstance(expanded, ContainerRun) and expanded.entrypoint is not None:
        expanded = dataclasses.replace(expanded, entrypoint=expand(expanded.entrypoint, env))
    return expanded
