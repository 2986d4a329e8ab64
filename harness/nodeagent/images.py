"""The image map: which local process runs for a container image.

There is no container engine here, so an image name is a key into this table, and the "image" is a
program the harness already has. A container whose image matches no rule fails as an image pull does
(``ErrImagePull``, then ``ImagePullBackOff``; the pod stays Pending).

===========================================  ============================================================
image (any tag or digest)                    runs
===========================================  ============================================================
``epp-harness/vllm-sim`` (any registry)      our vLLM simulator; container ``args`` are
                                             ``python -m harness.sim`` flags (``harness.sim._cli``)
``ghcr.io/llm-d/llm-d-inference-sim``        our vLLM simulator behind llm-d-inference-sim's flags
                                             (``harness.sim._llmd``): upstream's sim Deployment runs
                                             unchanged
``registry.k8s.io/pause``,                   a process that only waits for SIGTERM (cheap pods for
``k8s.gcr.io/pause``                         churn tests)
===========================================  ============================================================

The container's ``command`` is ignored for these images (their entrypoint is fixed, as an image's
ENTRYPOINT is); ``args`` and ``env`` are theirs. Every container also gets ``EPP_HARNESS_POD_IP`` (the
address its servers bind: the pod network is loopback addresses), ``HOSTNAME`` (the pod name) and
``KUBERNETES_SERVICE_HOST``/``PORT`` (the API server), as a kubelet sets the service variables.

Adding an image (the door issue 10 uses for the EPP itself): write a ``Runtime`` and put an
``ImageRule`` in front of the defaults, ``DEFAULT_IMAGES.with_rule(ImageRule(...))``. ``prepare`` gets
the container spec and a ``LaunchContext`` (the pod, its address, a private working directory, the API
server's address, the agent's API client for calls such as a TokenRequest, and ``run_alongside`` for
work that lasts as long as the pod) and returns what to run. ``harness.nodeagent.epp_image`` is the
EPP's: an ``Executable`` of the Containerfile's ENTRYPOINT with the container's args, after writing
the pod's projected ServiceAccount token, CA and namespace (renewed before expiry) and pointing the
EPP's in-cluster configuration at them; the agent runs ``epp_image.AGENT_IMAGES``. Python programs
that can be imported ahead of time should be a
``PythonEntry`` instead, listed in ``preload``: the zygote then forks them in milliseconds.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from harness.nodeagent.runtime import Command, Executable, PythonEntry

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class ImageRef:
    """``[registry/]repository[:tag][@digest]``; ``name`` is everything before the tag."""

    name: str
    tag: str
    digest: str

    @classmethod
    def parse(cls, image: str) -> ImageRef:
        rest, _, digest = image.strip().partition("@")
        slash, colon = rest.rfind("/"), rest.rfind(":")
        if colon > slash:  # a colon before the last slash is a registry port, not a tag
            return cls(rest[:colon], rest[colon + 1 :], digest)
        return cls(rest, "", digest)

    def is_repository(self, *names: str) -> bool:
        """The name is one of ``names`` exactly (``docker.io/library/`` prefixes not assumed)."""
        return self.name in names

    def ends_with(self, path: str) -> bool:
        """The name is ``path`` or ``<any registry or org>/path``."""
        return self.name == path or self.name.endswith("/" + path)


@dataclass(frozen=True)
class LaunchContext:
    """What a runtime may need to build a container's command."""

    pod: Mapping[str, Any]
    pod_ip: str
    workdir: Path
    api_server_host: str
    api_server_port: str
    api: Any = None  # the agent's async API client (harness.nodeagent.api.PodApi), for runtimes that call it
    # Runs a coroutine for as long as the pod runs (cancelled when the pod's worker ends), e.g. a
    # projected token's renewal; None where nothing owns such work (then the runtime must not need it).
    run_alongside: Callable[[Coroutine[Any, Any, None], str], None] | None = None


class ContainerConfigError(ValueError):
    """The container spec cannot be run as given (reported as CreateContainerConfigError)."""


class Runtime(Protocol):
    """What runs for one image: a program, with the container's args."""

    @property
    def description(self) -> str: ...

    @property
    def preload(self) -> tuple[str, ...]:
        """Modules the zygote imports ahead of time (for ``PythonEntry`` commands)."""
        ...

    async def prepare(self, container: Mapping[str, Any], context: LaunchContext) -> Command: ...


def _args(container: Mapping[str, Any]) -> tuple[str, ...]:
    args = container.get("args") or []
    if not isinstance(args, list):
        raise ContainerConfigError("args must be a list of strings")
    return tuple(str(a) for a in args)


@dataclass(frozen=True)
class SimulatorRuntime:
    """Our simulator; ``entry`` says whose command line it reads (ours or llm-d-inference-sim's)."""

    entry: str
    description: str

    @property
    def preload(self) -> tuple[str, ...]:
        return (self.entry.partition(":")[0],)

    async def prepare(self, container: Mapping[str, Any], context: LaunchContext) -> Command:
        return PythonEntry(self.entry, _args(container))


@dataclass(frozen=True)
class PauseRuntime:
    """registry.k8s.io/pause: a process that does nothing until it is told to stop."""

    description: str = "a process that waits for SIGTERM"
    preload: tuple[str, ...] = ("harness.nodeagent.images",)

    async def prepare(self, container: Mapping[str, Any], context: LaunchContext) -> Command:
        sleep = shutil.which("sleep")
        if sleep is not None:
            return Executable((sleep, "infinity"))
        return PythonEntry("harness.nodeagent.images:pause", ())


def pause(argv: Sequence[str]) -> int:
    """The pause container's program when there is no ``sleep`` binary: wait for a signal; on SIGTERM
    or SIGINT exit 0, as registry.k8s.io/pause does (and as the zygote's children do when stopped
    before they start)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    while True:
        signal.pause()


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


@dataclass(frozen=True)
class ImageRule:
    pattern: str  # how the README table spells it
    matches: Callable[[ImageRef], bool]
    runtime: Runtime


class ImageMap:
    """Rules in order; the first that matches an image decides what runs."""

    def __init__(self, rules: Sequence[ImageRule]) -> None:
        self.rules = tuple(rules)

    def resolve(self, image: str) -> Runtime | None:
        ref = ImageRef.parse(image)
        return next((rule.runtime for rule in self.rules if rule.matches(ref)), None)

    def with_rule(self, rule: ImageRule) -> ImageMap:
        """A map that tries ``rule`` before these."""
        return ImageMap((rule, *self.rules))

    @property
    def preload(self) -> tuple[str, ...]:
        modules = [m for rule in self.rules for m in rule.runtime.preload]
        return tuple(dict.fromkeys(modules))

    def known(self) -> str:
        """One line naming the images this map runs (for the ErrImagePull message)."""
        return ", ".join(rule.pattern for rule in self.rules)


HARNESS_SIM_IMAGE: Final = "epp-harness/vllm-sim"
LLMD_SIM_IMAGE: Final = "ghcr.io/llm-d/llm-d-inference-sim"
PAUSE_IMAGES: Final = ("registry.k8s.io/pause", "k8s.gcr.io/pause")

DEFAULT_IMAGES: Final = ImageMap(
    (
        ImageRule(
            f"{HARNESS_SIM_IMAGE}:*",
            lambda ref: ref.ends_with(HARNESS_SIM_IMAGE),
            SimulatorRuntime("harness.sim._cli:main", "the vLLM simulator (python -m harness.sim flags)"),
        ),
        ImageRule(
            f"{LLMD_SIM_IMAGE}:*",
            lambda ref: ref.is_repository(LLMD_SIM_IMAGE),
            SimulatorRuntime(
                "harness.sim._llmd:main", "the vLLM simulator behind llm-d-inference-sim's flags"
            ),
        ),
        ImageRule(
            " or ".join(f"{p}:*" for p in PAUSE_IMAGES),
            lambda ref: ref.is_repository(*PAUSE_IMAGES),
            PauseRuntime(),
        ),
    )
)


def image_id(image: str) -> str:
    """A stable, well-formed ``imageID`` for an image the map knows (no registry was asked)."""
    ref = ImageRef.parse(image)
    digest = ref.digest or "sha256:" + hashlib.sha256(image.encode()).hexdigest()
    return f"{ref.name}@{digest}"


__all__ = [
    "DEFAULT_IMAGES",
    "ContainerConfigError",
    "ImageMap",
    "ImageRef",
    "ImageRule",
    "LaunchContext",
    "PauseRuntime",
    "Runtime",
    "SimulatorRuntime",
]
