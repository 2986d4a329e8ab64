"""The vLLM simulator's image (``harness.sim``), built like the EPP's: no registry, cached by content.

``epp-harness/vllm-sim:<hash>``: the Debian base (``harness.cluster.container_images``) with

* the simulator's dependencies (``aiohttp``, ``prometheus-client``, ``uvloop`` and what they need),
  installed in a build stage from the wheelhouse of the EPP's build base
  (``harness.nodeagent.image_builds``), so they are the locked versions of ``requirements/epp.txt``,
  offline, hashes checked when downloaded;
* the simulator's source only: ``harness/__init__.py``, ``harness/base/`` (its ``StartStop``) and
  ``harness/sim/`` (nothing else of the harness), on ``PYTHONPATH``;
* ``ENTRYPOINT ["python3", "-m", "harness.sim"]`` as the unprivileged user 65532: a pod's ``args``
  are ``python -m harness.sim`` flags, as for the process the node agent runs for
  ``epp-harness/vllm-sim:<any other tag>``; it binds ``$EPP_HARNESS_POD_IP``.

The tag hashes the recipe, both base tags and every copied file, so an edit to ``harness/sim/``
makes a new image and an unchanged checkout finds or loads the cached one. Because its repository
is ``epp-harness/vllm-sim``, the node agent runs a pod naming that exact tag as a container
(``harness.nodeagent.containers``).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from harness.base.process import temp_prefix
from harness.cluster.container_engine import DockerEngine
from harness.cluster.container_images import (
    CONTENT_LABEL,
    ImageReady,
    base_image,
    content_hash,
    ensure_image,
    tree_hash,
)
from harness.nodeagent.image_builds import EppImageBuild, copy_into

SIM_IMAGE_REPOSITORY: Final = "epp-harness/vllm-sim"
SIM_SOURCES: Final = ("harness/__init__.py", "harness/base", "harness/sim")
SIM_REQUIREMENTS: Final = ("aiohttp", "prometheus-client", "uvloop")
SIM_USER: Final = "65532:65532"
_BUILD_TIMEOUT_S: Final = 900.0
_RECIPE: Final = """\
FROM {build_base} AS deps
RUN pip install --quiet --no-compile --target /deps {requirements}

FROM {base}
COPY --from=deps /deps /opt/sim/deps
COPY harness /opt/sim/harness
ENV PYTHONPATH=/opt/sim/deps:/opt/sim PYTHONDONTWRITEBYTECODE=1
USER {user}
ENTRYPOINT ["python3", "-m", "harness.sim"]
"""


@dataclass(frozen=True)
class SimImageBuild:
    epp: EppImageBuild = field(default_factory=EppImageBuild)

    def recipe(self) -> str:
        return _RECIPE.format(
            build_base=self.epp.build_base_tag(),
            base=self.epp.base.tag,
            requirements=" ".join(SIM_REQUIREMENTS),
            user=SIM_USER,
        )

    def tag(self) -> str:
        source = self.epp.source
        parts: list[tuple[str, str | bytes]] = [
            ("recipe", self.recipe()),
            *tree_hash(source, [source / path for path in SIM_SOURCES]),
        ]
        return f"{SIM_IMAGE_REPOSITORY}:{content_hash(parts)}"

    def ensure(self, engine: DockerEngine) -> ImageReady:
        """The simulator image in ``engine``: present, loaded from its tarball, or built."""
        began = time.monotonic()
        tag = self.tag()

        def build() -> None:
            base_image(engine, self.epp.base)
            build_base = self.epp.build_base_tag()
            ensure_image(engine, build_base, lambda: self.epp.build_base(engine, build_base))
            self._build(engine, tag)

        ready = ensure_image(engine, tag, build)
        return ImageReady(ready.tag, ready.how, time.monotonic() - began)

    def _build(self, engine: DockerEngine, tag: str) -> None:
        with tempfile.TemporaryDirectory(prefix=temp_prefix("sim-context")) as work:
            context = Path(work)
            for path in SIM_SOURCES:
                copy_into(self.epp.source / path, context / path)
            (context / "Containerfile").write_text(self.recipe())
            engine.docker(
                "build", "--network", "none",
                "--label", f"{CONTENT_LABEL}={tag.rpartition(':')[2]}",
                "-t", tag, "-f", context / "Containerfile", context,
                timeout=_BUILD_TIMEOUT_S,
            )  # fmt: skip
