"""Binaries built from Go modules at pinned releases: resolved like envtest, else built once into a cache.

A ``GoBuild`` is one wrapper module and one ``go build`` that produces one or more ``GoBinary``s;
declaring a new binary (see ``harness.cluster.go_binaries``) is a data change, not new plumbing.

Why wrapper modules: ``go install pkg@version`` refuses modules whose go.mod has ``replace`` lines,
and both Kubernetes and etcd have them. A throw-away module that *requires* the upstream module
(plus whatever replaces the declaration derives from upstream's own go.mod) builds with nothing but
the Go module proxy. Binaries that share a wrapper module share one ``go build`` (one link of the
common packages, one Go build cache); unrelated ones never share a module, because minimal version
selection would move each one's dependencies away from the versions its authors tested.

Resolution order, per binary, as controller-runtime's envtest does:

1. ``$TEST_ASSET_<NAME>`` (an explicit file: it must exist);
2. ``$KUBEBUILDER_ASSETS/<name>`` (the directory must exist; a binary it lacks comes from below), or
   ``/usr/local/kubebuilder/bin/<name>`` when ``KUBEBUILDER_ASSETS`` is unset;
3. the harness cache, ``<cache_root>/<name>/v<version>/<name>``;
4. a build into the cache.

A binary from 1 or 2 must report the pinned version (the pin is what the tests were written
against); a mismatch is an error that names the binary, both versions and the override to change
(a probed ``/usr/local/kubebuilder/bin`` binary of another version is skipped with a note instead).
Concurrent runs build once: the build runs under a file lock and every binary appears by atomic
rename, only after it answered its version command.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from filelock import FileLock, Timeout

from harness.base.binaries import BinaryNotFoundError, cache_root

ASSETS_ENV: Final = "KUBEBUILDER_ASSETS"
DEFAULT_ASSETS_DIR: Final = Path("/usr/local/kubebuilder/bin")
GO_INSTALL_HINT: Final = (
    "install Go >= {minimum} from https://go.dev/dl/ (for example: "
    "curl -fsSLO https://go.dev/dl/go1.26.8.linux-amd64.tar.gz && "
    "tar -C /usr/local -xzf go1.26.8.linux-amd64.tar.gz && export PATH=/usr/local/go/bin:$PATH); "
    "apt-get install golang-go is too old (Debian bookworm ships Go 1.19). "
    "Alternatively set KUBEBUILDER_ASSETS (or TEST_ASSET_<NAME>) to prebuilt binaries."
)

_GO_DIRECTIVE_RE: Final = re.compile(r"^go\s+(\d+\.\d+(?:\.\d+)?)\s*$", re.MULTILINE)
_GO_VERSION_RE: Final = re.compile(r"(?:\bgo|^)(\d+)\.(\d+)(?:\.(\d+))?")
_MAJOR_SUFFIX_RE: Final = re.compile(r"^v\d+$")


class GoBuildError(RuntimeError):
    """A build failed; the message carries the failing command and the tail of its output."""


class GoToolchainMissingError(GoBuildError):
    """``go`` is absent or too old; the message says exactly what to install."""


class BinaryVersionError(RuntimeError):
    """A binary given through the environment is not the pinned version."""


@dataclass(frozen=True)
class BuildContext:
    """What a declaration's go.mod and ldflags functions may use."""

    version: str  # without the leading "v"
    upstream_go_mod: str  # the go.mod of the required module, as the proxy serves it
    commit: str | None  # the tag's commit when the proxy says (``Origin.Hash``), else None
    build_date: dt.datetime


@dataclass(frozen=True)
class GoBinary:
    """One executable: its file name, its main package, and how it proves its version.

    ``version_args=()`` means the program has no version command (upstream's EPP v0.3.0): then
    ``version_output`` must appear in the build information Go embeds in every binary (the module
    lines ``go version -m`` prints, e.g. ``dep\tsigs.k8s.io/...\tv0.3.0``), read without running it.
    """

    name: str
    package: str
    version_args: tuple[str, ...]
    version_output: str  # must appear in the output of ``<name> <version_args>`` (or its build info)
    env: str = ""  # override variable; default TEST_ASSET_<NAME>

    @property
    def env_var(self) -> str:
        return self.env or "TEST_ASSET_" + re.sub(r"[^A-Z0-9]", "_", self.name.upper())


def _plain_ldflags(context: BuildContext) -> str:
    return "-s -w"


@dataclass(frozen=True)
class GoBuild:
    """One wrapper module requiring ``module@v<version>`` and one ``go build`` of its binaries.

    ``go_mod`` may add lines to the wrapper's go.mod (derived from ``BuildContext.upstream_go_mod``);
    ``ldflags`` stamps versions the way upstream's own build does.
    """

    name: str
    module: str
    version: str
    binaries: tuple[GoBinary, ...]
    ldflags: Callable[[BuildContext], str] = _plain_ldflags
    tags: str = ""
    go_mod_extra: Callable[[BuildContext], Sequence[str]] | None = None
    # The wrapper's go directive when upstream's go.mod has none (a pre-modules "+incompatible"
    # release, whose go.mod the proxy synthesises from the module path alone).
    legacy_go: str = ""

    @property
    def wrapper_module(self) -> str:
        return f"example.invalid/{self.name}-build"

    def binary(self, name: str) -> GoBinary:
        for binary in self.binaries:
            if binary.name == name:
                return binary
        raise KeyError(f"{self.name} builds no binary named {name!r}")


@dataclass(frozen=True)
class Resolved:
    """Where a binary is, where it came from, and what a build cost (``None`` when nothing was built)."""

    path: Path
    source: str  # "env", "assets", "cache" or "built"
    build_seconds: float | None = None
    peak_rss_mib: float | None = None


# --------------------------------------------------------------------------- pure parts (unit-tested)


def go_directive(go_mod: str) -> str:
    """The ``go`` directive of a go.mod ("1.26.0")."""
    match = _GO_DIRECTIVE_RE.search(go_mod)
    if match is None:
        raise GoBuildError("the upstream go.mod has no 'go' directive")
    return match.group(1)


def parse_go_version(text: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) from ``go version`` output ("go1.26.8") or a go directive ("1.26.0")."""
    match = _GO_VERSION_RE.search(text.strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def upstream_go_directive(build: GoBuild, go_mod: str) -> str:
    """Upstream's go directive, or the declaration's ``legacy_go`` for a go.mod without one."""
    if build.legacy_go and _GO_DIRECTIVE_RE.search(go_mod) is None:
        return build.legacy_go
    return go_directive(go_mod)


def wrapper_go_mod(build: GoBuild, context: BuildContext) -> str:
    """The wrapper module: upstream's go directive, a require of the module, and the declaration's extras."""
    lines = [
        f"module {build.wrapper_module}",
        "",
        f"go {upstream_go_directive(build, context.upstream_go_mod)}",
        "",
    ]
    if build.go_mod_extra is not None:
        lines += [*build.go_mod_extra(context), ""]
    lines += [f"require {build.module} v{build.version}", ""]
    return "\n".join(lines)


def default_executable_name(package: str) -> str:
    """The file ``go build -o DIR/`` writes for ``package`` (a ``/vN`` suffix names the element before it)."""
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and _MAJOR_SUFFIX_RE.match(parts[-1]):
        return parts[-2]
    return parts[-1]


def cached_path(build: GoBuild, binary: GoBinary) -> Path:
    """``<cache_root>/<name>/v<version>/<name>``: one directory per version, so pins never collide."""
    return cache_root() / binary.name / f"v{build.version}" / binary.name


# --------------------------------------------------------------------------- resolution


def find(build: GoBuild, binary: GoBinary, note: TextIO | None = None) -> Resolved | None:
    """An existing ``binary`` from the environment or the cache, without building anything."""
    explicit = os.environ.get(binary.env_var)
    if explicit:
        path = Path(explicit)
        if not _is_executable(path):
            raise BinaryNotFoundError(f"${binary.env_var}={explicit}: no executable {binary.name} there")
        check_version(build, binary, path, f"${binary.env_var}")
        return Resolved(path, "env")
    assets = os.environ.get(ASSETS_ENV)
    if assets:
        if not Path(assets).is_dir():
            raise BinaryNotFoundError(f"${ASSETS_ENV}={assets} is not a directory")
        candidate = Path(assets) / binary.name
        if _is_executable(candidate):
            check_version(build, binary, candidate, f"${ASSETS_ENV}")
            return Resolved(candidate, "assets")
    else:
        candidate = DEFAULT_ASSETS_DIR / binary.name
        if _is_executable(candidate):
            try:
                check_version(build, binary, candidate, f"the default {DEFAULT_ASSETS_DIR}")
                return Resolved(candidate, "assets")
            except BinaryVersionError as exc:
                say(note or sys.stderr, f"note: skipping {candidate}: {exc}")
    cached = cached_path(build, binary)
    if _is_executable(cached):
        return Resolved(cached, "cache")
    return None


def check_version(build: GoBuild, binary: GoBinary, path: Path, origin: str) -> None:
    """Raise ``BinaryVersionError`` unless ``path`` reports the pinned version."""
    output = version_report(binary, path)
    if binary.version_output not in output:
        reported = output.strip().splitlines()[0] if output.strip() else "nothing"
        raise BinaryVersionError(
            f"{binary.name} from {origin} ({path}) reports {reported!r}, but the harness pins "
            f"{build.module} v{build.version} (expected {binary.version_output!r}); point "
            f"{binary.env_var} or {ASSETS_ENV} at binaries of that release, or unset them to use the "
            "harness cache (built from Go modules)"
        )


def version_report(binary: GoBinary, path: Path) -> str:
    """What ``path`` says about its version: its version command's output, or its embedded build info."""
    if not binary.version_args:
        return _build_info(str(path), *_file_identity(path))
    return _version_output(str(path), binary.version_args, *_file_identity(path))


_BUILD_INFO_MAGIC: Final = b"\xff Go buildinf:"
_BUILD_INFO_HEADER: Final = 32
_BUILD_INFO_INLINE: Final = 0x2  # flag: the strings follow the header (Go >= 1.18)


def parse_build_info(data: bytes) -> str:
    """The module information Go >= 1.18 embeds in a binary (``path``, ``mod``, ``dep`` lines).

    Layout (``debug/buildinfo``): a 32-byte header starting with the magic, flag byte 15 bit 1 set
    when the Go version and the module information follow inline, each as a uvarint length and
    bytes. The magic can also occur as data (a program that reads build info), so every occurrence
    is tried until one holds module lines. Returns "" when the binary carries none.
    """
    start = data.find(_BUILD_INFO_MAGIC)
    while start >= 0:
        if len(data) >= start + _BUILD_INFO_HEADER and data[start + 15] & _BUILD_INFO_INLINE:
            strings = _uvarint_strings(data, start + _BUILD_INFO_HEADER, 2)
            if len(strings) == 2 and b"path\t" in strings[1]:
                info = strings[1]
                if len(info) >= 33 and info[-17:-16] == b"\n":  # 16-byte sentinels around it
                    info = info[16:-16]
                return info.decode("utf-8", "replace")
        start = data.find(_BUILD_INFO_MAGIC, start + 1)
    return ""


def _uvarint_strings(data: bytes, position: int, count: int) -> list[bytes]:
    strings: list[bytes] = []
    for _ in range(count):
        length = shift = 0
        while position < len(data) and shift < 64:
            byte = data[position]
            position += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if position + length > len(data):
            break
        strings.append(data[position : position + length])
        position += length
    return strings


@functools.lru_cache(maxsize=64)
def _build_info(path: str, size: int, mtime_ns: int) -> str:
    try:
        return parse_build_info(Path(path).read_bytes())
    except OSError as exc:
        return f"<{exc}>"


@functools.lru_cache(maxsize=64)
def _version_output(path: str, args: tuple[str, ...], size: int, mtime_ns: int) -> str:
    """The version command's output, once per file version (each call costs a process start)."""
    try:
        run = subprocess.run([path, *args], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"<{exc}>"
    return run.stdout + run.stderr


def _file_identity(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def ensure(build: GoBuild, progress: TextIO | None = None) -> dict[str, Resolved]:
    """Every binary of ``build``: found, or built into the cache (once, under a file lock)."""
    out = progress if progress is not None else sys.stderr
    found = {b.name: find(build, b, out) for b in build.binaries}
    missing = [b for b in build.binaries if found[b.name] is None]
    if not missing:
        return {name: r for name, r in found.items() if r is not None}
    lock_path = cache_root() / ".locks" / f"{build.name}-v{build.version}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say(out, f"another process is building {build.name} v{build.version}; waiting for {lock_path}")
        lock.acquire()
    try:
        missing = [b for b in missing if not _is_executable(cached_path(build, b))]  # built meanwhile?
        results = {b.name: Resolved(cached_path(build, b), "cache") for b in build.binaries}
        if missing:
            started = time.monotonic()
            build_binaries(build, missing, out)
            seconds = time.monotonic() - started
            rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            for binary in missing:
                results[binary.name] = Resolved(cached_path(build, binary), "built", seconds, rss)
        return {name: found[name] or results[name] for name in results}
    finally:
        lock.release()


def build_binaries(build: GoBuild, binaries: Sequence[GoBinary], out: TextIO) -> None:
    """Build ``binaries`` of ``build`` in one ``go build`` and rename each into the cache."""
    go = require_go((1, 21))
    work = cache_root() / ".build"
    work.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{build.name}-", dir=work))
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    names = ", ".join(b.name for b in binaries)
    step = f"[{build.name}]"
    try:
        say(out, f"{step} 1/4 resolving {build.module}@v{build.version} (go mod download) for {names}")
        info = _download_module_info(go, f"{build.module}@v{build.version}", workdir, env)
        upstream = Path(info["GoMod"]).read_text(encoding="utf-8")
        required = parse_go_version(upstream_go_directive(build, upstream))
        if required is not None:
            require_go(required[:2], go)
        origin = info.get("Origin") or {}
        context = BuildContext(build.version, upstream, origin.get("Hash"), dt.datetime.now(dt.UTC))
        (workdir / "go.mod").write_text(wrapper_go_mod(build, context), encoding="utf-8")
        packages = [b.package for b in binaries]
        say(out, f"{step} 2/4 go get -tool {' '.join(packages)} (fetching modules)")
        run_counting(
            [go, "get", "-tool", *(f"{p}@v{build.version}" for p in packages)],
            workdir,
            env,
            out,
            lambda line: line.startswith("go: downloading"),
            "modules downloaded",
        )
        build_env = {**env, "CGO_ENABLED": "0"}  # static, as upstream's release builds
        tags = [f"-tags={build.tags}"] if build.tags else []
        total = _count_dependencies(go, workdir, build_env, tags, packages)
        say(out, f"{step} 3/4 go build {names} ({total} packages; cached ones are not recompiled)")
        output_dir = workdir / "bin"
        output_dir.mkdir()
        command = [go, "build", "-v", "-trimpath", *tags, "-ldflags", build.ldflags(context)]
        target = [str(output_dir / binaries[0].name)] if len(binaries) == 1 else [f"{output_dir}/"]
        run_counting(
            [*command, "-o", *target, *packages],
            workdir,
            build_env,
            out,
            lambda line: bool(line) and not line.startswith(("#", "go:", " ")),
            f"packages compiled (of {total})",
        )
        say(out, f"{step} 4/4 checking versions and moving into {cache_root()}")
        for binary in binaries:
            built = output_dir / (
                binary.name if len(binaries) == 1 else default_executable_name(binary.package)
            )
            output = version_report(binary, built)
            if binary.version_output not in output:
                raise GoBuildError(
                    f"built {binary.name} reports {output.strip()!r}, expected {binary.version_output!r}"
                )
            destination = cached_path(build, binary)
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(built, destination)  # same file system: the cache root holds the workdir
            say(out, f"{binary.name} v{build.version} ready at {destination}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- helpers


def require_go(minimum: tuple[int, ...], go: str | None = None) -> str:
    """The ``go`` command if at least ``minimum``, else ``GoToolchainMissingError`` saying what to do."""
    wanted = ".".join(map(str, minimum))
    go = go or shutil.which("go")
    if go is None:
        raise GoToolchainMissingError(
            "a binary must be built and `go` is not on PATH: " + GO_INSTALL_HINT.format(minimum=wanted)
        )
    try:
        output = subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise GoToolchainMissingError(
            f"`{go} version` failed ({exc}): " + GO_INSTALL_HINT.format(minimum=wanted)
        ) from exc
    found = parse_go_version(output)
    if found is None or found[: len(minimum)] < minimum:
        raise GoToolchainMissingError(
            f"`{go}` is {output.strip()!r}, too old for this build: " + GO_INSTALL_HINT.format(minimum=wanted)
        )
    return go


def download_module(module_at_version: str) -> dict[str, Any]:
    """``go mod download -json`` of one module version (its ``Dir``, ``GoMod``, ``Origin`` ...)."""
    go = require_go((1, 21))
    env = {**os.environ, "GOTOOLCHAIN": "local"}
    with tempfile.TemporaryDirectory(prefix="go-download-") as scratch:  # outside any module
        return _download_module_info(go, module_at_version, Path(scratch), env)


def _download_module_info(
    go: str, module_at_version: str, workdir: Path, env: Mapping[str, str]
) -> dict[str, Any]:
    plain_env = {k: v for k, v in env.items() if k != "GOFLAGS"}
    command = [go, "mod", "download", "-json", module_at_version]
    result = subprocess.run(command, cwd=workdir, env=plain_env, capture_output=True, text=True)
    try:
        info = json.loads(result.stdout) if result.stdout.strip() else {}
    except json.JSONDecodeError:
        info = {}
    if result.returncode != 0 or "Error" in info or "GoMod" not in info:
        detail = info.get("Error") or f"{result.stdout}{result.stderr}".strip()
        raise GoBuildError(f"`{' '.join(command)}` failed: {detail}")
    return dict(info)


def _count_dependencies(
    go: str, workdir: Path, env: Mapping[str, str], tags: Sequence[str], packages: Iterable[str]
) -> int:
    command = [go, "list", *tags, "-deps", *packages]
    result = subprocess.run(command, cwd=workdir, env=dict(env), capture_output=True, text=True)
    if result.returncode != 0:
        raise GoBuildError(f"`{' '.join(command)}` failed:\n{result.stderr[-4000:]}")
    return len(result.stdout.split())


def run_counting(
    command: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    out: TextIO,
    counts: Callable[[str], bool],
    label: str,
) -> None:
    """Run ``command`` streaming its output as a live count; on failure raise with the output tail."""
    interactive = out.isatty()
    tail: list[str] = []
    count = 0
    last_report = time.monotonic()
    with subprocess.Popen(
        command, cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.rstrip("\n")
            tail = [*tail[-59:], line]
            if counts(line):
                count += 1
                now = time.monotonic()
                if interactive:
                    out.write(f"\r      {count} {label}")
                    out.flush()
                elif now - last_report >= 10:
                    say(out, f"      {count} {label} ...")
                    last_report = now
        returncode = process.wait()
    if interactive:
        out.write("\r")
    say(out, f"      {count} {label}")
    if returncode != 0:
        joined = "\n".join(tail)
        raise GoBuildError(f"`{' '.join(command)}` exited with {returncode}; last output:\n{joined}")


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def say(out: TextIO, message: str) -> None:
    out.write(message + "\n")
    out.flush()
