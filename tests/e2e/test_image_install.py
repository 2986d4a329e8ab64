"""The Containerfile's install recipe, replayed without a container engine.

The build stage's COPY lines decide what the build context holds, its wheel build and the runtime
stage's offline install are repeated in a fresh virtualenv (kept in the harness cache under a key of
the wheel's files, the lock and the interpreter: `installed_venvs`), and the image's ENTRYPOINT must
then run. This catches a wheel that misses a module or a dependency missing from requirements/epp.txt;
what it cannot check (the base image, the USER switch, BuildKit's bind mount) the container tier
checks on the image itself (tests/e2e/test_epp_container.py, where an engine runs), hadolint and the
static tests in tests/unit/packaging. This replay needs no engine, so it runs wherever the suite does.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.nodeagent import containerfile

from . import installed_venvs

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
_TIMEOUT_S = 600


def _run(*command: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT_S
    )
    assert result.returncode == 0, f"{' '.join(map(str, command))}:\n{result.stdout}\n{result.stderr}"
    return result


def _copy_build_context(stage: containerfile.Stage, context: Path) -> None:
    """Put into ``context`` exactly what the stage's COPY lines take from the repository."""
    for copy in stage.all("COPY"):
        *sources, destination = copy.arguments.split()
        assert not any(s.startswith("--") for s in sources), f"unsupported COPY flags: {copy.arguments}"
        for source in sources:
            origin = ROOT / source
            target = context / destination
            if destination.endswith("/") and origin.is_file():
                target = target / origin.name
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)


def test_the_image_recipe_installs_a_working_epp_without_the_harness(tmp_path: Path) -> None:
    stages = containerfile.read(ROOT / containerfile.CONTAINERFILE)
    layout = containerfile.image_layout(stages)
    context, wheels = tmp_path / "context", tmp_path / "wheels"
    context.mkdir()
    _copy_build_context(stages[0], context)

    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", wheels, ".", cwd=context)  # fmt: skip
    [wheel] = wheels.glob("*.whl")
    lock = context / "requirements" / "epp.txt"

    def install(venv: Path) -> None:
        python = venv / "bin" / "python"
        _run(python, "-m", "pip", "install", "--quiet", "--require-hashes", "-r", lock)
        _run(python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", wheel)

    # A fresh venv per exact wheel, lock and interpreter, reused while they stay the same.
    venv = installed_venvs.cached_venv("image-recipe", installed_venvs.input_key(wheel, lock), install)
    python = venv / "bin" / "python"

    # Run from an empty directory: the repository's own epp/ and harness/ must not be importable.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    entrypoint = venv / "bin" / layout.entrypoint[0]
    help_text = _run(entrypoint, *layout.entrypoint[1:], "--help", cwd=elsewhere).stdout
    assert "--poolName" in help_text
    # The whole EPP imports with only its locked runtime dependencies.
    _run(python, "-c", "import epp.server.runner, epp.__main__", cwd=elsewhere)
    missing = subprocess.run([python, "-c", "import harness"], capture_output=True, text=True, cwd=elsewhere)
    assert missing.returncode != 0, "the harness must not be in the image"
