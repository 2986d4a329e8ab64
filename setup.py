"""The build step pyproject.toml cannot say: copy the files the harness ships (the chart, the
examples, the Containerfile; `harness.base.shipped.SHIPPED`) into the wheel, under harness/_shipped/.
Everything else about the project is declared in pyproject.toml."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from harness.base.shipped import PACKAGED_DIR, SHIPPED  # noqa: E402


class BuildPyWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the checkout's own files
            return
        target = Path(self.build_lib) / "harness" / PACKAGED_DIR
        for relative in SHIPPED:
            source, destination = ROOT / relative, target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, destination, dirs_exist_ok=True)
            else:
                shutil.copy2(source, destination)


setup(cmdclass={"build_py": BuildPyWithShippedFiles})
