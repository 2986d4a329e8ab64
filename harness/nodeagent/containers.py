"""The node agent's container runtime: our images run as real containers under the harness's dockerd.

When the agent is given an engine (``--container-engine DIR``: the directory of a running
``harness.cluster.container_engine.DockerEngine``), a container whose image is one of ours
(a repository under ``epp-harness/``) that the engine has, or that the harness's image cache holds
as a tarball (then it is loaded, as a kubelet pulls), runs as a container; every other image goes to
the process runtime (``harness.nodeagent.images``) as before. So ``epp-harness/inference-epp:dev``
stays a process and ``epp-harness/inference-epp:<content hash>`` (what ``harness.nodeagent.
image_builds`` builds) is a container.

How a pod's container becomes a container (``ContainerRuntime.prepare``, flags from
``harness.nodeagent.container_spec``):

* ``--network host``: the loopback pod-IP model is kept, so the program binds the pod's own
  127.x.y.z. Our programs learn it as they do as processes: ``$EPP_HARNESS_POD_IP`` (the simulator),
  or the flags of ``ADDRESS_ARGS`` (the EPP: ``--bindAddress``/``--debugBindAddress``).
* the pod's and the container's securityContext, its resources as cgroup limits;
* its ``volumeMounts``: the ServiceAccount admission plugin's projected volume (``kube-api-access-*``)
  written by ``harness.nodeagent.serviceaccount`` (token bound to the pod, ``kube-root-ca.crt``,
  namespace; the volume's ``defaultMode``, 0644, so the image's user reads them; renewed before
  expiry) and mounted read-only where the pod says (``/var/run/secrets/kubernetes.io/serviceaccount``),
  so the program finds them where it would in a cluster; ``emptyDir`` as a directory of the pod's
  (mode 0777, as a kubelet makes it) or, ``medium: Memory``, a tmpfs with its ``sizeLimit``;
* the environment a kubelet injects and the container's ``env`` (not the agent's ``PATH``: the
  image's own applies).

``ContainerLauncher`` is the counterpart of the process launcher (``harness.nodeagent.runtime``),
with the same ``run``/``signal`` surface: ``docker create`` (named ``k8s_<container>_<pod>_
<namespace>_<uid>_<attempt>`` as dockershim named them, labelled with the pod), ``docker start``,
then ``docker wait`` resolves ``exited`` (the exit code; ``OOMKilled`` when the kernel killed it for
its memory limit) while ``docker logs --follow`` copies its output to the pod's log file. Signals go
through ``docker kill --signal``, so SIGKILL reaches the container, not a client. An exited container
is removed (its log stays in the pod's directory); ``close()`` removes every container of this agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from harness.cluster.container_engine import DOCKER_CLI, ENGINE_LABEL, DockerCommandError, DockerEngine
from harness.cluster.container_images import OUR_REPOSITORIES, tarball
from harness.nodeagent import container_spec
from harness.nodeagent.container_spec import ImageConfig, Mount
from harness.nodeagent.epp_image import EPP_IMAGE_NAME, epp_address_args
from harness.nodeagent.images import ContainerConfigError, ImageRef, LaunchContext
from harness.nodeagent.runtime import ExitStatus, Process, StartFailed
from harness.nodeagent.serviceaccount import ProjectedServiceAccount, ServiceAccountVolumeError

log = logging.getLogger(__name__)

AGENT_LABEL: Final = "epp-harness.node-agent"
"""Label on every container the agent creates (its value: the agent's state directory)."""
POD_UID_LABEL: Final = "io.kubernetes.pod.uid"
_CLI_TIMEOUT_S: Final = 120.0
_LOAD_TIMEOUT_S: Final = 600.0
_LOGS_DRAIN_S: Final = 5.0
_DEFAULT_SERVICE_ACCOUNT_MODE: Final = 0o644  # a projected volume's defaultMode (420)

ADDRESS_ARGS: Final[Mapping[str, Callable[[str], tuple[str, ...]]]] = {EPP_IMAGE_NAME: epp_address_args}
"""Per image (the repository's last part): the arguments that tell the program its pod's address."""


@dataclass(frozen=True)
class ContainerRun:
    """What the container runtime creates: ``docker create FLAGS [--entrypoint E] IMAGE ARGV``."""

    image: ImageConfig
    name: str  # the container's name in the pod (the engine's container name is built from it)
    flags: tuple[str, ...]
    entrypoint: str | None
    argv: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()


class ContainerRuntime:
    """The ``Runtime`` (``harness.nodeagent.images``) of one of our images present in the engine."""

    preload: tuple[str, ...] = ()

    def __init__(self, image: ImageConfig) -> None:
        self.image = image
        self.description = f"the image {image.reference} as a container ({image.id[:19]})"

    async def prepare(self, container: Mapping[str, Any], context: LaunchContext) -> ContainerRun:
        pod = context.pod
        meta = pod.get("metadata") or {}
        name = str(container.get("name", "container"))
        flags = [
            *container_spec.security_flags(pod, container, self.image),
            *container_spec.resource_flags(container),
        ]
        for mount in await self._mounts(container, context):
            flags += mount.flags()
        if container.get("workingDir"):
            flags += ["--workdir", str(container["workingDir"])]
        address = ADDRESS_ARGS.get(ImageRef.parse(self.image.reference).name.rpartition("/")[2])
        entrypoint, argv = container_spec.command_line(
            container, address(context.pod_ip) if address is not None else ()
        )
        labels = (
            ("io.kubernetes.pod.name", str(meta.get("name", ""))),
            ("io.kubernetes.pod.namespace", str(meta.get("namespace", ""))),
            (POD_UID_LABEL, str(meta.get("uid", ""))),
            ("io.kubernetes.container.name", name),
        )
        return ContainerRun(self.image, name, tuple(flags), entrypoint, argv, labels)

    async def _mounts(self, container: Mapping[str, Any], context: LaunchContext) -> list[Mount]:
        mounts = []
        name = str(container.get("name", "container"))
        for entry in container.get("volumeMounts") or ():
            if entry.get("subPath") or entry.get("subPathExpr"):
                raise ContainerConfigError("volumeMounts with subPath are not supported by the node agent")
            volume = container_spec.volume_of(context.pod, str(entry.get("name", "")))
            target, read_only = str(entry.get("mountPath", "")), bool(entry.get("readOnly"))
            directory = context.workdir / f"{name}.{volume['name']}"
            if "emptyDir" in volume:
                empty = volume["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    limit = empty.get("sizeLimit")
                    size = int(container_spec.quantity(limit)) if limit else None
                    mounts.append(Mount(target, None, read_only, size))
                    continue
                directory.mkdir(parents=True, exist_ok=True)
                directory.chmod(0o777)
                mounts.append(Mount(target, directory, read_only))
            elif container_spec.is_service_account_volume(volume):
                mode = int((volume.get("projected") or {}).get("defaultMode", _DEFAULT_SERVICE_ACCOUNT_MODE))
                await _project_service_account(context, directory, mode)
                mounts.append(Mount(target, directory, True))
            else:
                kinds = sorted(set(volume) - {"name"})
                raise ContainerConfigError(
                    f"volume {volume['name']!r} ({', '.join(kinds)}) is not supported by the harness "
                    "node agent's container runtime (emptyDir and the ServiceAccount token are)"
                )
        return mounts


async def _project_service_account(context: LaunchContext, directory: Path, mode: int) -> None:
    if context.api is None or context.run_alongside is None:
        raise ContainerConfigError("this node cannot project a ServiceAccount token (no API client)")
    volume = ProjectedServiceAccount(context.api, context.pod, directory, mode=mode)
    try:
        await volume.write()
    except ServiceAccountVolumeError as exc:
        raise ContainerConfigError(str(exc)) from exc
    os.chmod(directory, 0o755)
    context.run_alongside(volume.keep_fresh(), "token renewal")


def is_ours(image: str) -> bool:
    return ImageRef.parse(image).name.startswith(OUR_REPOSITORIES)


@dataclass
class _Running:
    process: Process
    container_id: str
    followers: list[asyncio.subprocess.Process]


class ContainerLauncher:
    """Creates, signals and removes containers in one engine for one agent (see the module doc)."""

    def __init__(self, engine: DockerEngine, agent_id: str) -> None:
        self.engine = engine
        self.agent_id = agent_id
        self._attempts: dict[str, int] = {}
        self._running: dict[int, _Running] = {}  # by id(process)
        self._watchers: set[asyncio.Task[None]] = set()
        self._image_lock = asyncio.Lock()

    # ---- images --------------------------------------------------------------------------------
    async def runtime_for(self, image: str) -> ContainerRuntime | None:
        """The container runtime of ``image`` if it is ours and present (loaded from the cache if
        need be); None sends the container to the process runtime."""
        if not is_ours(image):
            return None
        config = await self._inspect_image(image)
        if config is None:
            saved = tarball(image)
            if not saved.exists():
                return None
            async with self._image_lock:  # one load at a time (two replicas of a new image)
                config = await self._inspect_image(image)
                if config is None:
                    log.info("loading %s from %s", image, saved)
                    await self._docker("load", "-q", "-i", str(saved), timeout=_LOAD_TIMEOUT_S)
                    config = await self._inspect_image(image)
        return ContainerRuntime(config) if config is not None else None

    async def _inspect_image(self, image: str) -> ImageConfig | None:
        try:
            answer = json.loads(await self._docker("image", "inspect", image))
        except DockerCommandError:
            return None
        found = answer[0]
        return ImageConfig(image, str(found["Id"]), str((found.get("Config") or {}).get("User") or ""))

    # ---- containers ----------------------------------------------------------------------------
    async def run(
        self, command: ContainerRun, *, env: Mapping[str, str], log_file: Path, pod_uid: str
    ) -> Process:
        """Create and start one container; raises StartFailed when the engine refuses it."""
        pod = dict(command.labels)
        key = f"{pod_uid}/{command.name}"
        attempt = self._attempts.get(key, 0)
        self._attempts[key] = attempt + 1
        name = "_".join(("k8s", command.name, pod["io.kubernetes.pod.name"],
                         pod["io.kubernetes.pod.namespace"], pod_uid, str(attempt)))  # fmt: skip
        create: list[str] = ["create", "--name", name, "--network", "host",
                             "--label", f"{ENGINE_LABEL}={self.engine.dir}",
                             "--label", f"{AGENT_LABEL}={self.agent_id}"]  # fmt: skip
        for label, value in command.labels:
            create += ["--label", f"{label}={value}"]
        for variable, value in env.items():
            create += ["--env", f"{variable}={value}"]
        create += list(command.flags)
        if command.entrypoint is not None:
            create += ["--entrypoint", command.entrypoint]
        create += [command.image.id, *command.argv]
        try:
            container_id = (await self._docker(*create)).strip()
        except DockerCommandError as exc:
            raise StartFailed(_engine_said(exc)) from exc
        try:
            await self._docker("start", container_id)
            state = await self._state(container_id)
        except DockerCommandError as exc:
            await self._remove(container_id)
            raise StartFailed(_engine_said(exc)) from exc
        loop = asyncio.get_running_loop()
        process = Process(int(state.get("Pid") or 0), loop.create_future(), container_id=container_id)
        log_handle = log_file.open("ab")
        try:
            followers = [
                await self._follow(["logs", "--follow", container_id], log_handle),
            ]
            waiter = await self._follow(["wait", container_id], None)
        finally:
            log_handle.close()  # the followers hold their own copies
        running = _Running(process, container_id, followers)
        self._running[id(process)] = running
        task = asyncio.ensure_future(self._watch(running, waiter))
        task.set_name(f"container {name}")
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        return process

    async def signal(self, process: Process, sig: signal.Signals) -> None:
        """``docker kill --signal``, unless the container has exited already."""
        if process.exited.done() or not process.container_id:
            return
        with contextlib.suppress(DockerCommandError):  # it exited meanwhile
            await self._docker("kill", "--signal", str(int(sig)), process.container_id)

    async def close(self) -> None:
        """Remove every container of this agent; resolve what still waits for an exit."""
        with contextlib.suppress(DockerCommandError, TimeoutError):
            mine = f"label={AGENT_LABEL}={self.agent_id}"
            ids = (await self._docker("ps", "-aq", "--filter", mine)).split()
            if ids:
                await self._docker("rm", "--force", "--volumes", *ids, timeout=_LOAD_TIMEOUT_S)
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        for running in self._running.values():
            if not running.process.exited.done():
                running.process.exited.set_result(ExitStatus(None, int(signal.SIGKILL)))
            for follower in running.followers:
                with contextlib.suppress(ProcessLookupError):
                    follower.kill()
                await follower.wait()
        self._running.clear()

    # ---- one container's end -------------------------------------------------------------------
    async def _watch(self, running: _Running, waiter: asyncio.subprocess.Process) -> None:
        try:
            out, _ = await waiter.communicate()
            status = await self._exit_status(running.container_id, out)
            if not running.process.exited.done():
                running.process.exited.set_result(status)
            for follower in running.followers:  # they end with the container; never wait forever
                try:
                    await asyncio.wait_for(follower.wait(), _LOGS_DRAIN_S)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        follower.kill()
                    await follower.wait()
            await self._remove(running.container_id)
        finally:
            if waiter.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    waiter.kill()
                await waiter.wait()
            self._running.pop(id(running.process), None)

    async def _exit_status(self, container_id: str, waited: bytes) -> ExitStatus:
        try:
            state = await self._state(container_id)
        except DockerCommandError:
            state = {}
        code = state.get("ExitCode")
        if code is None:
            text = waited.decode(errors="replace").strip()
            code = int(text) if text.lstrip("-").isdigit() else 128
        return ExitStatus(int(code), None, "OOMKilled" if state.get("OOMKilled") else None)

    async def _state(self, container_id: str) -> dict[str, Any]:
        answer = json.loads(await self._docker("inspect", "--type", "container", container_id))
        return dict(answer[0]["State"])

    async def _remove(self, container_id: str) -> None:
        with contextlib.suppress(DockerCommandError, TimeoutError):
            await self._docker("rm", "--force", "--volumes", container_id)

    # ---- the CLI -------------------------------------------------------------------------------
    async def _follow(self, args: Sequence[str], output: Any) -> asyncio.subprocess.Process:
        """A long-running CLI call (``logs --follow``, ``wait``): stdout to ``output`` or a pipe."""
        return await asyncio.create_subprocess_exec(
            str(DOCKER_CLI),
            *args,
            env=self.engine.env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output if output is not None else asyncio.subprocess.PIPE,
            stderr=output if output is not None else asyncio.subprocess.DEVNULL,
        )

    async def _docker(self, *args: str, timeout: float = _CLI_TIMEOUT_S) -> str:  # noqa: ASYNC109
        process = await asyncio.create_subprocess_exec(
            str(DOCKER_CLI),
            *args,
            env=self.engine.env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        if process.returncode != 0:
            said = err.decode(errors="replace")[-2000:]
            raise DockerCommandError(f"docker {' '.join(args[:2])} exited {process.returncode}: {said}")
        return out.decode(errors="replace")


def _engine_said(exc: DockerCommandError) -> str:
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else "the engine refused the container"
