"""Files the harness ships beside its code: the Helm chart, the examples and the Containerfile.

In a checkout they are the repository's own files. An installed wheel has copies of them under
``harness/_shipped/``, put there by the build (``setup.py``'s build step copies `SHIPPED`), because a
wheel can only carry what lies inside its packages. One lookup serves both, so ``harness up --deploy``,
the node agent and the demo find them wherever the harness runs from, and the repository keeps one
copy of each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

# Repository-relative paths, copied into the wheel as they are (directories whole).
SHIPPED: Final = ("deploy/chart", "examples", "Containerfile")
PACKAGED_DIR: Final = "_shipped"
_HARNESS: Final = Path(__file__).resolve().parents[1]


class ShippedFileMissingError(FileNotFoundError):
    """Neither the installed copy nor a checkout has the file: a broken install."""


def shipped_path(relative: str, harness_dir: Path = _HARNESS) -> Path:
    """The path of ``relative`` (a path under one of `SHIPPED`): the wheel's copy, else the checkout's.

    ``harness_dir`` is the ``harness`` package's directory (another one only in tests).
    """
    if not any(relative == top or relative.startswith(f"{top}/") for top in SHIPPED):
        raise ValueError(f"{relative!r} is not under any shipped path {SHIPPED}")
    for candidate in (harness_dir / PACKAGED_DIR / relative, harness_dir.parent / relative):
        if candidate.exists():
            return candidate
    raise ShippedFileMissingError(
        f"{relative} is neither in the installed harness ({harness_dir / PACKAGED_DIR}) nor in a "
        f"checkout ({harness_dir.parent}): reinstall the wheel"
    )
