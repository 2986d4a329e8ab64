"""The install tests' venv cache: built once per key, reused, never reused half-built, pruned."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from harness.base.binaries import CACHE_ENV
from tests.e2e import installed_venvs


def _fake_venv(venv: Path) -> None:
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def test_a_venv_is_built_once_per_key_and_reused(cache: Path) -> None:
    built: list[Path] = []
    first = installed_venvs.cached_venv("k", "key1", built.append, make_venv=_fake_venv)
    again = installed_venvs.cached_venv("k", "key1", built.append, make_venv=_fake_venv)
    other = installed_venvs.cached_venv("k", "key2", built.append, make_venv=_fake_venv)
    assert first == again != other
    assert built == [first, other]
    assert first.is_relative_to(cache)


def test_a_failed_install_is_never_reused(cache: Path) -> None:
    def broken(venv: Path) -> None:
        raise RuntimeError("pip failed")

    with pytest.raises(RuntimeError, match="pip failed"):
        installed_venvs.cached_venv("k", "key", broken, make_venv=_fake_venv)
    built: list[Path] = []
    venv = installed_venvs.cached_venv("k", "key", built.append, make_venv=_fake_venv)
    assert built == [venv]


def test_an_interrupted_build_left_on_disk_is_rebuilt(cache: Path) -> None:
    venv = installed_venvs.cached_venv("k", "key", lambda v: None, make_venv=_fake_venv)
    (venv / ".install-complete").unlink()  # as if the install was killed before its marker
    built: list[Path] = []
    assert installed_venvs.cached_venv("k", "key", built.append, make_venv=_fake_venv) == venv
    assert built == [venv]


def test_only_the_newest_venvs_are_kept(cache: Path) -> None:
    venvs = [
        installed_venvs.cached_venv("k", f"key{i}", lambda v: None, make_venv=_fake_venv) for i in range(5)
    ]
    kept = [v for v in venvs if v.exists()]
    assert kept == venvs[-installed_venvs.KEEP :]


def test_the_key_follows_the_wheels_files_not_its_zip_bytes(tmp_path: Path) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text("a==1 --hash=sha256:00\n")
    one = _wheel(tmp_path / "one.whl", {"epp/a.py": b"x = 1\n", "epp/b.py": b""})
    same = _wheel(tmp_path / "same.whl", {"epp/b.py": b"", "epp/a.py": b"x = 1\n"})
    changed = _wheel(tmp_path / "changed.whl", {"epp/a.py": b"x = 2\n", "epp/b.py": b""})
    key = installed_venvs.input_key(one, lock)
    assert installed_venvs.input_key(same, lock) == key
    assert installed_venvs.input_key(changed, lock) != key
    lock.write_text("a==2 --hash=sha256:00\n")
    assert installed_venvs.input_key(one, lock) != key
