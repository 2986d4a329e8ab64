"""The lock files cover what pyproject.toml declares, pinned exactly and with hashes.

A dependency added to pyproject.toml without `ci/lock.sh` would otherwise be missing from every
fresh set-up (pip installs only the lock) and fail far from its cause.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lock: str) -> dict[str, str]:
    text = (ROOT / "requirements" / lock).read_text()
    pins = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        first = block.splitlines()[0]
        match = _PIN.match(first)
        if match:
            assert "--hash=sha256:" in block, f"{lock}: {first} has no hash"
            pins[_normalise(match.group(1))] = match.group(2)
    return pins


def _declared(*extras: str) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    names = set()
    for requirement in requirements:
        match = _NAME.match(requirement)
        assert match is not None, requirement
        names.add(_normalise(match.group(1)))
    return names - {"inference-epp"}


@pytest.mark.parametrize(
    ("lock", "extras"),
    [pytest.param("epp.txt", (), id="runtime"), pytest.param("dev.txt", ("harness", "test"), id="dev")],
)
def test_every_declared_dependency_is_pinned_with_hashes(lock: str, extras: tuple[str, ...]) -> None:
    pins = _pins(lock)
    missing = _declared(*extras) - set(pins)
    assert not missing, f"run ci/lock.sh: requirements/{lock} lacks {sorted(missing)}"


def test_runtime_pins_agree_with_the_dev_lock() -> None:
    runtime, dev = _pins("epp.txt"), _pins("dev.txt")
    differing = {name: (v, dev.get(name)) for name, v in runtime.items() if dev.get(name, v) != v}
    assert not differing, f"run ci/lock.sh: the two locks pin differently: {differing}"
