"""Virtualenvs for the install tests: built once per exact set of inputs, kept in the harness cache.

What the install tests check (our wheel plus a hash-locked set of dependencies installs into a fresh
virtualenv and works far from the checkout) depends on nothing but their inputs: the wheel's files,
the lock file and the interpreter. Installing a lock of a hundred wheels is most of what these tests
cost (about 100 s each on this machine, more under load), and it gives the same venv every time the
inputs are the same. So the venv is built under a key of exactly those inputs, in the harness cache
(``$EPP_HARNESS_CACHE`` or ``~/.cache/inference-epp``, `harness.base.binaries.cache_root`): an
empty cache or any changed input (one byte of one module of the wheel, a lock line, another Python)
builds a new one from scratch, as on a fresh machine. A venv counts only once its install finished
(a marker written last), so a failed or interrupted install is never reused. The newest few per
kind are kept, the rest removed.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

from filelock import FileLock

from harness.base.binaries import cache_root

KEEP: Final = 3  # venvs kept per kind: the current one and a couple of recent branches' ones
_DIRNAME: Final = "install-test-venvs"
_COMPLETE: Final = ".install-complete"

Installer = Callable[[Path], None]
"""Fills a fresh venv (given its directory) with what the test installs into it."""


def wheel_digest(wheel: Path) -> str:
    """A digest of a wheel's files and their bytes: the same for a rebuild of the same source.

    The zip's own bytes differ between builds (timestamps), its members do not.
    """
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + b"\0" + hashlib.sha256(archive.read(name)).digest())
    return digest.hexdigest()


def input_key(wheel: Path, lock: Path) -> str:
    """The key of a venv: the wheel's files, the lock's bytes and the interpreter that builds it.

    The interpreter is the base one (a venv made from our .venv runs on it), not the checkout's
    .venv, whose path differs from clone to clone.
    """
    digest = hashlib.sha256()
    digest.update(wheel_digest(wheel).encode())
    digest.update(lock.read_bytes())
    digest.update(f"{sys.version}\0{sys.base_prefix}".encode())
    return digest.hexdigest()[:24]


def python_venv(venv: Path) -> None:
    """A fresh, empty virtualenv (with pip) at `venv`."""
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, text=True)


def cached_venv(kind: str, key: str, install: Installer, make_venv: Installer = python_venv) -> Path:
    """The venv of `kind` for `key`, built with `install` into a fresh `make_venv` when missing."""
    root = cache_root() / _DIRNAME / kind
    root.mkdir(parents=True, exist_ok=True)
    venv = root / key
    # A venv's scripts name its own path, so it is built where it lives; the marker, written last,
    # says the install finished. Everything happens under the lock: no reader sees half a venv.
    complete = venv / _COMPLETE
    with FileLock(str(root / ".lock")):
        if not complete.exists():
            shutil.rmtree(venv, ignore_errors=True)
            make_venv(venv)
            try:
                install(venv)
            except BaseException:
                shutil.rmtree(venv, ignore_errors=True)
                raise
            complete.touch()
        _prune(root, keep=venv)
    return venv


def _prune(root: Path, keep: Path) -> None:
    """Remove all but the newest `KEEP` finished venvs, and what an interrupted build left."""
    finished = sorted(
        (p for p in root.iterdir() if (p / _COMPLETE).exists()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    keep.touch()  # used now: the newest
    for stale in [p for p in finished if p != keep][KEEP - 1 :]:
        shutil.rmtree(stale, ignore_errors=True)
    for unfinished in (p for p in root.iterdir() if p.is_dir() and not (p / _COMPLETE).exists()):
        shutil.rmtree(unfinished, ignore_errors=True)
