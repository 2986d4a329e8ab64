"""The EPP's image, built here from the ``Containerfile`` with no registry and no network in the build.

Three images, each cached by content (``harness.cluster.container_images``):

1. the Debian base (``debootstrap`` bookworm minbase + ``python3.11`` + ``pip``, ``docker import``);
2. the build base: (1) plus a wheelhouse of ``requirements/epp.txt`` downloaded on this machine by
   this virtualenv's pip (its index and its cache; hashes checked), with ``PIP_NO_INDEX`` and
   ``PIP_FIND_LINKS`` pointing pip at it, so the Containerfile's build stage resolves the same locked
   files offline;
3. the EPP image: ``docker build`` of the Containerfile with ``BUILD_IMAGE`` = (2) and
   ``BASE_IMAGE`` = (1) (for users the defaults stay ``python:3.11-slim-bookworm``), run with
   ``--network none``, from a build context that holds exactly what the Containerfile's COPY lines
   name (``harness.nodeagent.containerfile.copy_sources``). Its tag is
   ``epp-harness/inference-epp:<hash>``, which the node agent's ``*/inference-epp:*`` rule matches.

The image's hash covers the Containerfile, every file of the build context and the two base tags, so
an edit to ``epp/`` or to the lock makes a new image and an unchanged checkout loads the cached one.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from harness.base.process import temp_prefix
from harness.cluster.container_engine import DockerEngine, EngineUnavailable
from harness.cluster.container_images import (
    CONTENT_LABEL,
    DebianBase,
    ImageReady,
    base_image,
    content_hash,
    ensure_image,
    tree_hash,
)
from harness.nodeagent import containerfile

EPP_IMAGE_REPOSITORY: Final = "epp-harness/inference-epp"
BUILD_BASE_REPOSITORY: Final = "epp-harness/debian-python-wheels"
RUNTIME_LOCK: Final = "requirements/epp.txt"
_BUILD_TIMEOUT_S: Final = 1200.0


def checkout_root() -> Path:
    """The repository the image is built from (the harness's own checkout)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not (root / "epp").is_dir():
        raise EngineUnavailable(f"building the EPP image needs the source checkout; {root} is not one")
    return root


@dataclass(frozen=True)
class BuiltImages:
    """What ``epp_image`` made ready, each with how (present / loaded / built) and how long it took."""

    bases: tuple[ImageReady, ...]  # empty when the EPP image was present or loaded
    epp: ImageReady
    seconds: float

    @property
    def tag(self) -> str:
        return self.epp.tag


@dataclass(frozen=True)
class EppImageBuild:
    source: Path = field(default_factory=checkout_root)
    base: DebianBase = field(default_factory=DebianBase)

    def build_base_tag(self) -> str:
        lock = (self.source / RUNTIME_LOCK).read_bytes()
        return f"{BUILD_BASE_REPOSITORY}:{content_hash([('base', self.base.tag), ('lock', lock)])}"

    def context_files(self) -> list[tuple[str, str]]:
        stages = containerfile.read(self.source / containerfile.CONTAINERFILE)
        return [pair for stage in stages for pair in containerfile.copy_sources(stage)]

    def epp_tag(self) -> str:
        sources = [self.source / source for source, _ in self.context_files()]
        parts: list[tuple[str, str | bytes]] = [
            ("containerfile", (self.source / containerfile.CONTAINERFILE).read_bytes()),
            ("base", self.base.tag),
            ("build-base", self.build_base_tag()),
            *tree_hash(self.source, sources),
        ]
        return f"{EPP_IMAGE_REPOSITORY}:{content_hash(parts)}"

    def ensure(self, engine: DockerEngine) -> BuiltImages:
        """The EPP image in ``engine``; the bases are made ready only when it has to be built (a
        cached EPP image's tarball holds their layers already)."""
        began = time.monotonic()
        bases: list[ImageReady] = []

        def build() -> None:
            bases.append(base_image(engine, self.base))
            tag = self.build_base_tag()
            bases.append(ensure_image(engine, tag, lambda: self.build_base(engine, tag)))
            self._build_epp(engine, epp_tag)

        epp_tag = self.epp_tag()
        epp = ensure_image(engine, epp_tag, build)
        return BuiltImages(tuple(bases), epp, time.monotonic() - began)

    # ------------------------------------------------------------------ the builds

    def build_base(self, engine: DockerEngine, tag: str) -> None:
        with tempfile.TemporaryDirectory(prefix=temp_prefix("wheelhouse")) as work:
            context = Path(work)
            wheelhouse = context / "wheelhouse"
            download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                        "--dest", str(wheelhouse), "-r", str(self.source / RUNTIME_LOCK)]  # fmt: skip
            result = subprocess.run(
                download, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False
            )
            if result.returncode != 0:
                raise EngineUnavailable(f"pip download of {RUNTIME_LOCK} failed: {result.stderr[-3000:]}")
            (context / "Containerfile").write_text(
                f"FROM {self.base.tag}\n"
                "COPY wheelhouse /wheelhouse\n"
                "ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse PIP_DISABLE_PIP_VERSION_CHECK=1\n"
            )
            label = f"{CONTENT_LABEL}={tag.rpartition(':')[2]}"
            dockerfile = context / "Containerfile"
            build: list[str | Path] = [
                "build",
                "--network",
                "none",
                "--label",
                label,
                "-t",
                tag,
                "-f",
                dockerfile,
                context,
            ]
            engine.docker(*build, timeout=_BUILD_TIMEOUT_S)

    def _build_epp(self, engine: DockerEngine, tag: str) -> None:
        with tempfile.TemporaryDirectory(prefix=temp_prefix("epp-context")) as work:
            context = Path(work)
            for source, destination in self.context_files():
                copy_into(self.source / source, context / destination)
            engine.docker(
                "build", "--network", "none",
                "--build-arg", f"BASE_IMAGE={self.base.tag}",
                "--build-arg", f"BUILD_IMAGE={self.build_base_tag()}",
                "--label", f"{CONTENT_LABEL}={tag.rpartition(':')[2]}",
                "-t", tag, "-f", self.source / containerfile.CONTAINERFILE, context,
                timeout=_BUILD_TIMEOUT_S,
            )  # fmt: skip


def copy_into(origin: Path, target: Path) -> None:
    """COPY semantics for the cases the Containerfile uses: a directory's content, a file into a dir."""
    if origin.is_dir():
        shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        return
    if str(target).endswith("/") or target.is_dir():
        target = target / origin.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(origin, target)
