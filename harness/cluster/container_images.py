"""Images without a registry: built here, named by the hash of what they are built from, kept as tarballs.

No registry is reachable, so every image starts from a Debian root filesystem made by ``debootstrap``
(bookworm, ``minbase`` plus ``python3.11`` and ``pip``) and imported with ``docker import``; the
images built on it (the EPP's, from the ``Containerfile``) name that base with a build argument.

**Cached by content.** An image's tag ends in a hash of its inputs (the recipe below for the base;
the Containerfile, the build context and the base's tag for images built on it), and the same hash
is on the image as the label ``epp-harness.content``. Since an engine's data root does not outlive
it (``harness.cluster.container_engine``), a built image is saved to
``<cache>/images/<name>-<hash>.tar``; the next engine loads that file instead of building. A changed
input changes the tag, so a stale image is never used. Builds of one image by several processes at
once are serialised by a file lock: the second finds the tarball and loads it.

An engine on the kept data root (``kept_engine()``; ``harness.cluster.container_engine``) finds its
images still present from the last run: nothing is loaded, and ``ensure_image`` only touches the
tarball so the cache's pruning keeps it. At start such an engine drops the images of ours whose
tarball the cache no longer keeps (an older checkout's), dangling layers and the build cache, so
the kept root stays as small as the tarball cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from harness.base.binaries import cache_root
from harness.base.process import temp_prefix
from harness.cluster.container_engine import DockerEngine, EngineUnavailable, cache_lock, ensure_packages

OUR_REPOSITORIES: Final = "epp-harness/"
"""Every image the harness builds is in a repository with this prefix."""

CONTENT_LABEL: Final = "epp-harness.content"
DEBOOTSTRAP: Final = Path("/usr/sbin/debootstrap")
DEBIAN_MIRROR_ENV: Final = "EPP_HARNESS_DEBIAN_MIRROR"
DEFAULT_DEBIAN_MIRROR: Final = "http://deb.debian.org/debian"
_DEBOOTSTRAP_TIMEOUT_S: Final = 1200.0
_LOAD_TIMEOUT_S: Final = 600.0


@dataclass(frozen=True)
class DebianBase:
    """The recipe of the base image: every field is part of its content hash."""

    suite: str = "bookworm"
    variant: str = "minbase"
    # python3.11 is bookworm's interpreter (3.11.2; the EPP needs >= 3.11); pip installs the wheels.
    packages: tuple[str, ...] = ("python3.11", "python3-pip", "ca-certificates")
    name: str = "epp-harness/debian-python"
    recipe_version: str = "1"  # bump when the steps in build_base change

    def content_hash(self) -> str:
        parts = [("suite", self.suite), ("variant", self.variant), ("packages", " ".join(self.packages))]
        return content_hash([*parts, ("recipe", self.recipe_version)])

    @property
    def tag(self) -> str:
        return f"{self.name}:{self.suite}-{self.content_hash()}"


@dataclass(frozen=True)
class ImageReady:
    """An image present in an engine, and how it got there (for the build-time figures)."""

    tag: str
    how: str  # "present" (already in this engine), "loaded" (from the cache tarball), "built"
    seconds: float


def content_hash(parts: Iterable[tuple[str, str | bytes]]) -> str:
    """A short hash over named inputs (order matters; a name and its content both count)."""
    digest = hashlib.sha256()
    for name, content in parts:
        data = content.encode() if isinstance(content, str) else content
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def tree_hash(root: Path, paths: Iterable[Path]) -> list[tuple[str, bytes]]:
    """``(relative path, bytes)`` of every file in ``paths`` (files or directories) under ``root``,
    sorted, without ``__pycache__``: the content of a build context."""
    files: set[Path] = set()
    for path in paths:
        if path.is_dir():
            files.update(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        else:
            files.add(path)
    return [(str(p.relative_to(root)), p.read_bytes()) for p in sorted(files)]


def images_dir() -> Path:
    return cache_root() / "images"


def tarball(tag: str) -> Path:
    """Where an image with ``tag`` is kept between engines."""
    repository, _, version = tag.rpartition(":")
    return images_dir() / f"{repository.replace('/', '_')}+{version}.tar"  # "+" is in no repository name


KEPT_PER_REPOSITORY: Final = 3
"""Tarballs kept per image repository (checkouts sharing the cache may differ), the newest first."""


def _prune(tag: str) -> None:
    """Drop the oldest tarballs of ``tag``'s repository beyond ``KEPT_PER_REPOSITORY``."""
    repository = tag.rpartition(":")[0].replace("/", "_")
    same = sorted(
        images_dir().glob(f"{repository}+*.tar"),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in same[KEPT_PER_REPOSITORY:]:
        old.unlink(missing_ok=True)


def ensure_image(engine: DockerEngine, tag: str, build: Callable[[], None]) -> ImageReady:
    """``tag`` in ``engine``: already there, loaded from its tarball, or built by ``build()`` and saved."""
    began = time.monotonic()
    saved = tarball(tag)
    if engine.has_image(tag):
        _touch(saved)
        return ImageReady(tag, "present", time.monotonic() - began)
    with cache_lock(f"image-{saved.stem}"):
        if engine.has_image(tag):  # another process sharing this engine loaded it meanwhile
            return ImageReady(tag, "present", time.monotonic() - began)
        if not saved.exists():
            build()
            saved.parent.mkdir(parents=True, exist_ok=True)
            partial = saved.with_suffix(".partial")
            engine.docker("save", "-o", partial, tag, timeout=_LOAD_TIMEOUT_S)
            partial.replace(saved)
            _prune(tag)
            return ImageReady(tag, "built", time.monotonic() - began)
    engine.docker("load", "-q", "-i", saved, timeout=_LOAD_TIMEOUT_S)
    if not engine.has_image(tag):
        raise EngineUnavailable(f"{saved} did not load as {tag}")
    return ImageReady(tag, "loaded", time.monotonic() - began)


def _touch(saved: Path) -> None:
    if saved.exists():
        os.utime(saved)


def kept_engine() -> DockerEngine:
    """A started engine on the kept data root (a temporary one if another engine holds it), without
    the images the cache no longer keeps."""
    engine = DockerEngine(persistent=True).start()
    try:
        prune_images(engine)
    except BaseException:
        engine.stop()
        raise
    return engine


def prune_images(engine: DockerEngine) -> list[str]:
    """Remove images of ours without a cached tarball, dangling images and the build cache; the
    tags removed."""
    listed = engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}").split()
    stale = [tag for tag in listed if tag.startswith(OUR_REPOSITORIES) and not tarball(tag).exists()]
    if stale:
        engine.docker("rmi", "--force", *stale, timeout=_LOAD_TIMEOUT_S)
    engine.docker("image", "prune", "--force", timeout=_LOAD_TIMEOUT_S)
    engine.docker("builder", "prune", "--all", "--force", timeout=_LOAD_TIMEOUT_S, check=False)
    return stale


def base_image(engine: DockerEngine, recipe: DebianBase | None = None) -> ImageReady:
    """The Debian base image in ``engine`` (``debootstrap`` + ``docker import`` when not cached)."""
    recipe = recipe or DebianBase()
    return ensure_image(engine, recipe.tag, lambda: build_base(engine, recipe))


def build_base(engine: DockerEngine, recipe: DebianBase) -> None:
    """debootstrap a root filesystem, make pip usable in it, import it as ``recipe.tag``."""
    ensure_packages({DEBOOTSTRAP: "debootstrap"})
    mirror = os.environ.get(DEBIAN_MIRROR_ENV) or DEFAULT_DEBIAN_MIRROR
    work = Path(tempfile.mkdtemp(prefix=temp_prefix("rootfs")))
    rootfs = work / "rootfs"
    try:
        command = [str(DEBOOTSTRAP), f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}",
                   recipe.suite, str(rootfs), mirror]  # fmt: skip
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=_DEBOOTSTRAP_TIMEOUT_S, check=False
        )
        if result.returncode != 0:
            raise EngineUnavailable(
                f"{' '.join(command)} exited {result.returncode}: {result.stdout[-3000:]}"
            )
        # pip, not apt, owns this image's Python packages (PEP 668's marker would refuse them).
        for marker in (rootfs / "usr" / "lib").glob("python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        # The .debs debootstrap fetched, apt's lists, logs: not part of an image.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
            for path in (rootfs / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        archive = work / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", rootfs, "-cf", archive, "."],
                       check=True, capture_output=True, timeout=_LOAD_TIMEOUT_S)  # fmt: skip
        shutil.rmtree(rootfs)  # before the import: the machine holds one copy at a time
        engine.docker(
            "import",
            "--change", f"LABEL {CONTENT_LABEL}={recipe.content_hash()}",
            "--change", "ENV LANG=C.UTF-8",
            "--change", 'CMD ["python3"]',
            archive, recipe.tag,
            timeout=_LOAD_TIMEOUT_S,
        )  # fmt: skip
    finally:
        _unmount_below(work)
        shutil.rmtree(work, ignore_errors=True)


def _unmount_below(root: Path) -> None:
    """debootstrap mounts /proc and /sys in the target; a failed run can leave them mounted."""
    prefix = str(root)
    with open("/proc/self/mountinfo") as info:
        points = [line.split()[4] for line in info if line.split()[4].startswith(prefix + "/")]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
