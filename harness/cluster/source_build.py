"""An EPP built from a source checkout: ``harness build --epp-source DIR`` (``./cmd/epp`` of any Go module).

Today's full EPPs are not all served by the Go module proxy as a module one can require (llm-d-router's
is a public repository only), so the wrapper-module recipe of `harness.cluster.gobuild` cannot reach
them. This builds the checkout itself, in place, with the same toolchain rules as the pinned builds:
the local Go (``GOTOOLCHAIN=local``; a go directive newer than it is a clear error, never a download),
the user's Go module and build caches, the module proxy for dependencies, ``CGO_ENABLED=0``.

The checkout is never written to: ``-mod=readonly`` unless it vendors its modules (then Go picks
``vendor/`` itself), the binary goes to the harness cache. Its name there says what was built:
``<cache>/epp-source/<module path, / as +>/<revision>/epp`` where the revision is ``git-<commit>``
for a clean git checkout, ``git-<commit>-dirty-<content hash>`` for one with local changes, and
``tree-<content hash>`` for a directory outside git (an unpacked archive). The content hash covers
every file but ``.git``. A second build of the same revision is a cache hit; the binary is proven to
be that module's ``./cmd/epp`` by the build information Go embeds (``path\\t<module>/cmd/epp``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

from filelock import FileLock

from harness.base.binaries import cache_root
from harness.cluster import gobuild

PACKAGE: Final = "./cmd/epp"
CACHE_DIR: Final = "epp-source"
BINARY: Final = "epp"
_MODULE_RE: Final = re.compile(r"^module\s+(\S+)\s*$", re.MULTILINE)
_HASH_CHARS: Final = 12
_SKIPPED_DIRS: Final = frozenset({".git"})


@dataclass(frozen=True)
class SourceRevision:
    """Which module a checkout is and which revision of it: what the cache name is made of."""

    module: str
    revision: str  # git-<commit>, git-<commit>-dirty-<hash> or tree-<hash>

    @property
    def slug(self) -> str:
        return self.module.replace("/", "+")


@dataclass(frozen=True)
class SourceBuild:
    path: Path
    revision: SourceRevision
    build_seconds: float | None  # None: found in the cache


def module_path(go_mod: str) -> str:
    """The ``module`` line of a go.mod (quoted module paths are rare but legal)."""
    match = _MODULE_RE.search(go_mod)
    if match is None:
        raise gobuild.GoBuildError("go.mod has no 'module' line")
    return match.group(1).strip('"`')


def content_hash(directory: Path) -> str:
    """SHA-256 over every file's relative path, executable bit and bytes (``.git`` left out), in order."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        for name in sorted(files):
            path = Path(root) / name
            if path.is_symlink():
                entry = b"l" + os.readlink(path).encode()
            elif path.is_file():
                entry = (b"x" if os.access(path, os.X_OK) else b"f") + path.read_bytes()
            else:
                continue
            relative = path.relative_to(directory).as_posix().encode()
            digest.update(len(relative).to_bytes(4, "big") + relative)
            digest.update(len(entry).to_bytes(8, "big") + entry)
    return digest.hexdigest()[:_HASH_CHARS]


def _git(directory: Path, *args: str) -> str | None:
    git = shutil.which("git")
    if git is None:
        return None
    run = subprocess.run([git, "-C", str(directory), *args], capture_output=True, text=True, check=False)
    return run.stdout if run.returncode == 0 else None


def revision_of(directory: Path) -> SourceRevision:
    """The module path and revision of the checkout at ``directory`` (see the module docstring)."""
    go_mod = directory / "go.mod"
    if not go_mod.is_file():
        raise gobuild.GoBuildError(f"{directory} is no Go module: it has no go.mod")
    module = module_path(go_mod.read_text(encoding="utf-8"))
    commit = _git(directory, "rev-parse", "--verify", "HEAD")
    inside = _git(directory, "rev-parse", "--is-inside-work-tree")
    if commit and inside and inside.strip() == "true":
        changes = _git(directory, "status", "--porcelain", "--untracked-files=normal", "--", ".")
        revision = f"git-{commit.strip()}"
        if changes is None or changes.strip():
            revision += f"-dirty-{content_hash(directory)}"
        return SourceRevision(module, revision)
    return SourceRevision(module, f"tree-{content_hash(directory)}")


def cached_path(revision: SourceRevision) -> Path:
    return cache_root() / CACHE_DIR / revision.slug / revision.revision / BINARY


def expected_build_info(module: str) -> str:
    """What the embedded build information of ``module``'s ``./cmd/epp`` says first."""
    return f"path\t{module}/cmd/epp\n"


def _go_flags() -> str:
    """The user's GOFLAGS less any ``-mod`` (ours is ``-mod=readonly``: the checkout stays as it is)."""
    kept = [flag for flag in os.environ.get("GOFLAGS", "").split() if not flag.startswith("-mod=")]
    return " ".join(kept)


def build_from_source(directory: Path, progress: TextIO) -> SourceBuild:
    """``./cmd/epp`` of the Go module at ``directory``, from the cache or built into it (under a lock)."""
    directory = directory.resolve()
    if not (directory / "cmd" / "epp").is_dir():
        raise gobuild.GoBuildError(f"{directory} has no cmd/epp (--epp-source builds its ./cmd/epp)")
    revision = revision_of(directory)
    destination = cached_path(revision)
    if _is_executable(destination):
        return SourceBuild(destination, revision, None)
    lock_path = cache_root() / ".locks" / f"{CACHE_DIR}-{revision.slug}-{revision.revision}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_path)):
        if _is_executable(destination):  # another process built it meanwhile
            return SourceBuild(destination, revision, None)
        started = time.monotonic()
        _build(directory, revision, destination, progress)
        return SourceBuild(destination, revision, time.monotonic() - started)


def _build(directory: Path, revision: SourceRevision, destination: Path, out: TextIO) -> None:
    go = gobuild.require_go((1, 21))
    go_mod = (directory / "go.mod").read_text(encoding="utf-8")
    wanted = gobuild.parse_go_version(gobuild.go_directive(go_mod))
    if wanted is not None:
        gobuild.require_go(wanted, go)
    vendored = (directory / "vendor" / "modules.txt").is_file()
    env = {
        **os.environ,
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",  # static, as upstream's release images
        "GOFLAGS": _go_flags() if vendored else f"{_go_flags()} -mod=readonly".strip(),
    }
    step = f"[{revision.module}]"
    work = cache_root() / ".build"
    work.mkdir(parents=True, exist_ok=True)
    output_dir = Path(tempfile.mkdtemp(prefix="epp-source-", dir=work))
    try:
        built = output_dir / BINARY
        command = [go, "build", "-v", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", str(built)]
        gobuild.say(out, f"{step} 1/2 go build {PACKAGE} in {directory}")
        gobuild.run_counting(
            [*command, PACKAGE],
            directory,
            env,
            out,
            lambda line: bool(line) and not line.startswith(("#", "go:", " ")),
            "packages compiled",
        )
        info = gobuild.parse_build_info(built.read_bytes())
        if not info.startswith(expected_build_info(revision.module)):
            first = info.splitlines()[0] if info else "no build information"
            raise gobuild.GoBuildError(f"built {built} says {first!r}, not {revision.module}/cmd/epp")
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(built, destination)  # same file system: the cache root holds the build directory
        gobuild.say(out, f"{step} 2/2 {revision.module} {revision.revision} ready at {destination}")
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
