"""The EPP's image for the node agent: what ``*/inference-epp:*`` runs, read from the Containerfile.

There is no container engine here, so the image is never built; the agent runs what it would run:
the Containerfile's ENTRYPOINT (``epp``, the console script this virtualenv has, run by this
virtualenv's Python) with the image's ENV and the container's ``args``. The Containerfile stays the
only place the runtime layout is written (``harness.nodeagent.containerfile``).

Two things a container gets from its runtime are emulated:

- **The projected ServiceAccount volume**: a token requested for the pod's ServiceAccount (bound to
  the pod) and the ``kube-root-ca.crt`` CA are written to ``<pod dir>/<container>.serviceaccount/``
  and renewed before expiry (``harness.nodeagent.serviceaccount``); ``$EPP_SERVICE_ACCOUNT_DIR`` tells
  the EPP's in-cluster configuration where they are (it reads
  ``/var/run/secrets/kubernetes.io/serviceaccount`` otherwise). With
  ``automountServiceAccountToken: false`` nothing is written, as on a real node.
- **The pod's network namespace**: pods share the host's loopback here, so the EPP is told to bind
  its servers (``--bindAddress``) and its debug view (``--debugBindAddress``, loopback inside a real
  pod) to the pod's own address. They come before the container's args: the container's win.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from epp.k8s.config import SERVICE_ACCOUNT_DIR_ENV
from harness.nodeagent import containerfile
from harness.nodeagent.images import (
    DEFAULT_IMAGES,
    ContainerConfigError,
    ImageMap,
    ImageRef,
    ImageRule,
    LaunchContext,
)
from harness.nodeagent.runtime import Command, Executable
from harness.nodeagent.serviceaccount import ProjectedServiceAccount, ServiceAccountVolumeError

EPP_IMAGE_NAME: Final = "inference-epp"
"""The chart's ``inferenceExtension.image.name``: any registry and tag."""


@dataclass(frozen=True)
class EppRuntime:
    containerfile_path: Path = field(default_factory=containerfile.repository_containerfile)
    bin_dir: Path = field(default_factory=lambda: Path(sys.executable).parent)
    description: str = "the EPP: the Containerfile's ENTRYPOINT from this virtualenv, in-cluster config"
    preload: tuple[str, ...] = ()

    def layout(self) -> containerfile.ImageLayout:
        try:
            return containerfile.image_layout(containerfile.read(self.containerfile_path))
        except (OSError, containerfile.ContainerfileError) as exc:
            where = self.containerfile_path
            raise ContainerConfigError(f"cannot read the image layout ({where}): {exc}") from exc

    def program(self, entrypoint: str) -> Path:
        """The ENTRYPOINT resolved as the image's PATH would: this virtualenv's scripts first."""
        candidate = self.bin_dir / entrypoint
        if candidate.is_file():
            return candidate
        found = shutil.which(entrypoint)
        if found is None:
            raise ContainerConfigError(f"the image's ENTRYPOINT {entrypoint!r} is not in {self.bin_dir}")
        return Path(found)

    async def prepare(self, container: Mapping[str, Any], context: LaunchContext) -> Command:
        layout = self.layout()
        program = self.program(layout.entrypoint[0])
        args = container.get("args") or []
        if not isinstance(args, list):
            raise ContainerConfigError("args must be a list of strings")
        network = epp_address_args(context.pod_ip)
        env = list(layout.env)
        if _automounts_token(context.pod):
            directory = context.workdir / f"{container.get('name', 'container')}.serviceaccount"
            env.append((SERVICE_ACCOUNT_DIR_ENV, str(directory)))
            await self._project_service_account(context, directory)
        argv = (str(program), *layout.entrypoint[1:], *network, *(str(a) for a in args))
        return Executable(argv, env=tuple(env))

    async def _project_service_account(self, context: LaunchContext, directory: Path) -> None:
        if context.api is None or context.run_alongside is None:
            raise ContainerConfigError("this node cannot project a ServiceAccount token (no API client)")
        volume = ProjectedServiceAccount(context.api, context.pod, directory)
        try:
            await volume.write()
        except ServiceAccountVolumeError as exc:
            raise ContainerConfigError(str(exc)) from exc
        context.run_alongside(volume.keep_fresh(), "token renewal")


def epp_address_args(pod_ip: str) -> tuple[str, ...]:
    """What tells the EPP its pod's address: its servers and its debug view bind there."""
    return ("--bindAddress", pod_ip, "--debugBindAddress", pod_ip)


def _automounts_token(pod: Mapping[str, Any]) -> bool:
    return (pod.get("spec") or {}).get("automountServiceAccountToken") is not False


EPP_RULE: Final = ImageRule(
    f"*/{EPP_IMAGE_NAME}:*", lambda ref: ImageRef.ends_with(ref, EPP_IMAGE_NAME), EppRuntime()
)

AGENT_IMAGES: Final[ImageMap] = DEFAULT_IMAGES.with_rule(EPP_RULE)
"""What the node agent runs: the EPP's image, then the simulators and pause (``harness.nodeagent.images``)."""
