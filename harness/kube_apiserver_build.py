"""Resolve the kube-apiserver binary, building it from Go modules when nothing else provides it.

Order: ``$TEST_ASSET_KUBE_APISERVER`` / ``$KUBEBUILDER_ASSETS/kube-apiserver`` (as envtest), then the
harness cache (``<cache_root>/kube-apiserver/v<version>/kube-apiserver``), then a build.

Why a wrapper module: ``go install k8s.io/kubernetes/cmd/kube-apiserver@vX`` cannot work, because
k/k requires its staging modules at ``v0.0.0`` and maps them to ``./staging/...`` with ``replace``
lines that only apply inside k/k itself. Each staging module is also published as ``v0.Y.Z`` for
``v1.Y.Z``, so a wrapper module that replaces every one of them builds. The staging list is derived
from k/k's own go.mod (fetched through the ordinary ``go`` client), never typed by hand, because it
changes between releases (1.36 added two). The build mirrors the official one (static, trimpath,
``selinux,notest,grpcnotrace`` tags, ``-s -w``) and stamps the version variables so ``/version``
reports the pinned release instead of ``v0.0.0-master``.

Concurrent runs (xdist workers, parallel CI jobs) build once: the build runs under a file lock and
the binary appears by atomic rename, so nobody ever executes a half-written file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

from filelock import FileLock, Timeout

from harness.binaries import BinaryNotFoundError, cache_root

KUBERNETES_VERSION: Final = "1.36.3"
MIN_GO_VERSION: Final = (1, 26)
BUILD_TAGS: Final = "selinux,notest,grpcnotrace"
WRAPPER_MODULE: Final = "example.invalid/kube-apiserver-build"
_MAIN_PACKAGE: Final = "k8s.io/kubernetes/cmd/kube-apiserver"
_VERSION_PACKAGES: Final = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")

_GO_INSTALL_HINT: Final = (
    "install Go >= {minimum} from https://go.dev/dl/ (for example: "
    "curl -fsSLO https://go.dev/dl/go1.26.8.linux-amd64.tar.gz && "
    "tar -C /usr/local -xzf go1.26.8.linux-amd64.tar.gz && export PATH=/usr/local/go/bin:$PATH); "
    "apt-get install golang-go is too old (Debian bookworm ships Go 1.19). "
    "Alternatively set KUBEBUILDER_ASSETS to a directory that holds a kube-apiserver binary."
)

_STAGING_RE: Final = re.compile(
    r"^\s*(?:replace\s+)?(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/(k8s\.io/[\w.-]+)\s*$", re.MULTILINE
)
_GO_DIRECTIVE_RE: Final = re.compile(r"^go\s+(\d+\.\d+(?:\.\d+)?)\s*$", re.MULTILINE)
_GO_VERSION_RE: Final = re.compile(r"\bgo(\d+)\.(\d+)(?:\.(\d+))?")


class KubeApiserverBuildError(RuntimeError):
    """Building kube-apiserver failed; the message carries the failing command and its output tail."""


class GoToolchainMissingError(KubeApiserverBuildError):
    """``go`` is absent or too old; the message says exactly what to install."""


@dataclass(frozen=True)
class EnsureResult:
    """Where the binary is, where it came from, and what a build cost (``None`` when nothing was built)."""

    path: Path
    source: str  # "env", "cache" or "built"
    build_seconds: float | None = None
    peak_rss_mib: float | None = None


# --------------------------------------------------------------------------- pure parts (unit-tested)


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The staging modules k/k maps to ``./staging/src/<module>``, in go.mod order."""
    return [m.group(1) for m in _STAGING_RE.finditer(kubernetes_go_mod) if m.group(1) == m.group(2)]


def go_directive(kubernetes_go_mod: str) -> str:
    """The ``go`` directive of a go.mod ("1.26.0")."""
    match = _GO_DIRECTIVE_RE.search(kubernetes_go_mod)
    if match is None:
        raise KubeApiserverBuildError("k8s.io/kubernetes go.mod has no 'go' directive")
    return match.group(1)


def godebug_lines(kubernetes_go_mod: str) -> list[str]:
    """The ``godebug`` directives (single lines and blocks) verbatim, for runtime parity with upstream."""
    lines: list[str] = []
    in_block = False
    for line in kubernetes_go_mod.splitlines():
        stripped = line.strip()
        if in_block:
            lines.append(line)
            in_block = stripped != ")"
        elif re.match(r"^godebug\s*\($", stripped):
            lines.append(line)
            in_block = True
        elif stripped.startswith("godebug ") and line.startswith("godebug"):
            lines.append(line)
    return lines


def wrapper_go_mod(kubernetes_go_mod: str, version: str) -> str:
    """The wrapper module's go.mod: k/k's go/godebug lines, a require, and derived staging replaces."""
    modules = staging_modules(kubernetes_go_mod)
    if not modules:
        raise KubeApiserverBuildError(
            "found no './staging/src/k8s.io/...' replace lines in k8s.io/kubernetes go.mod"
        )
    staging_version = "v0." + version.split(".", 1)[1]
    out = [f"module {WRAPPER_MODULE}", "", f"go {go_directive(kubernetes_go_mod)}", ""]
    debug = godebug_lines(kubernetes_go_mod)
    if debug:
        out += [*debug, ""]
    out += [f"require k8s.io/kubernetes v{version}", "", "replace ("]
    out += [f"\t{m} => {m} {staging_version}" for m in modules]
    out += [")", ""]
    return "\n".join(out)


def version_ldflags(version: str, build_date: dt.datetime) -> str:
    """``-ldflags`` value as upstream's ``kube::version::ldflags`` sets it, for both version packages."""
    major, minor = version.split(".")[:2]
    values = {
        "gitVersion": f"v{version}",
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": build_date.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    flags = ["-s", "-w"]
    for package in _VERSION_PACKAGES:
        flags += [f"-X {package}.{name}={value}" for name, value in values.items()]
    return " ".join(flags)


def parse_go_version(output: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) from ``go version`` output or a go directive, or ``None``."""
    match = _GO_VERSION_RE.search(output)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


# --------------------------------------------------------------------------- resolution


def cached_binary_path(version: str = KUBERNETES_VERSION) -> Path:
    """Where the cache keeps kube-apiserver ``version`` (one subdirectory per version)."""
    return cache_root() / "kube-apiserver" / f"v{version}" / "kube-apiserver"


def find_kube_apiserver(version: str = KUBERNETES_VERSION) -> EnsureResult | None:
    """An existing binary from the environment or the cache, without building anything.

    An explicit ``KUBEBUILDER_ASSETS`` (or ``TEST_ASSET_KUBE_APISERVER``) that lacks the binary is an
    error rather than a silent fallback: the user asked for that directory.
    """
    explicit = os.environ.get("TEST_ASSET_KUBE_APISERVER")
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if explicit or assets:
        path = Path(explicit) if explicit else Path(assets or "") / "kube-apiserver"
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BinaryNotFoundError(f"no executable kube-apiserver at {path} (from the environment)")
        return EnsureResult(path, "env")
    cached = cached_binary_path(version)
    if cached.is_file() and os.access(cached, os.X_OK):
        return EnsureResult(cached, "cache")
    return None


def ensure_kube_apiserver(version: str = KUBERNETES_VERSION, progress: TextIO | None = None) -> EnsureResult:
    """Return a usable kube-apiserver, building it into the cache (once, under a file lock) if needed.

    ``progress`` receives human-readable build progress (default: stderr).
    """
    found = find_kube_apiserver(version)
    if found is not None:
        return found
    out = progress if progress is not None else sys.stderr
    target = cached_binary_path(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(target.parent / ".build.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _say(out, f"another process is building kube-apiserver v{version}; waiting for {lock.lock_file}")
        lock.acquire()
    try:
        if target.is_file():  # built by whoever held the lock before us
            return EnsureResult(target, "cache")
        started = time.monotonic()
        build_kube_apiserver(target, version, out)
        return EnsureResult(
            target,
            "built",
            time.monotonic() - started,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        )
    finally:
        lock.release()


def build_kube_apiserver(target: Path, version: str, out: TextIO) -> None:
    """Build kube-apiserver ``version`` into ``target`` through a throw-away wrapper module.

    The output is written next to ``target`` and renamed into place only after it ran ``--version``.
    """
    go = _require_go(MIN_GO_VERSION)
    workdir = Path(tempfile.mkdtemp(prefix="wrapper-", dir=target.parent))
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    try:
        _say(out, f"[1/4] resolving k8s.io/kubernetes@v{version} (go mod download)")
        kk_go_mod = _download_kubernetes_go_mod(go, version, workdir, env)
        required = parse_go_version(go_directive(kk_go_mod))
        if required is not None:
            _require_go(required[:2], go)
        module_text = wrapper_go_mod(kk_go_mod, version)
        (workdir / "go.mod").write_text(module_text, encoding="utf-8")
        _say(
            out, f"[2/4] wrapper module with {len(staging_modules(kk_go_mod))} staging replaces in {workdir}"
        )
        _say(out, f"[3/4] go get -tool {_MAIN_PACKAGE}@v{version} (fetching modules)")
        _run_counting(
            [go, "get", "-tool", f"{_MAIN_PACKAGE}@v{version}"],
            workdir,
            env,
            out,
            lambda line: line.startswith("go: downloading"),
            "modules downloaded",
        )
        total = _count_dependencies(go, workdir, env)
        _say(out, f"[4/4] go build ({total} packages in the graph; cached ones are not recompiled)")
        build_env = {**env, "CGO_ENABLED": "0"}
        ldflags = version_ldflags(version, dt.datetime.now(dt.UTC))
        command = [go, "build", "-v", "-trimpath", f"-tags={BUILD_TAGS}", "-ldflags", ldflags]
        _run_counting(
            [*command, "-o", str(partial), _MAIN_PACKAGE],
            workdir,
            build_env,
            out,
            lambda line: bool(line) and not line.startswith(("#", "go:", " ")),
            f"packages compiled (of {total})",
        )
        _check_version(partial, version)
        os.replace(partial, target)
        _say(out, f"kube-apiserver v{version} ready at {target}")
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- helpers


def _require_go(minimum: tuple[int, ...], go: str | None = None) -> str:
    wanted = ".".join(map(str, minimum))
    go = go or shutil.which("go")
    if go is None:
        raise GoToolchainMissingError(
            "kube-apiserver is not cached and `go` is not on PATH: " + _GO_INSTALL_HINT.format(minimum=wanted)
        )
    try:
        output = subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise GoToolchainMissingError(
            f"`{go} version` failed ({exc}): " + _GO_INSTALL_HINT.format(minimum=wanted)
        ) from exc
    found = parse_go_version(output)
    if found is None or found[: len(minimum)] < minimum:
        raise GoToolchainMissingError(
            f"`{go}` is {output.strip()!r}, too old to build kube-apiserver: "
            + _GO_INSTALL_HINT.format(minimum=wanted)
        )
    return go


def _download_kubernetes_go_mod(go: str, version: str, workdir: Path, env: Mapping[str, str]) -> str:
    """k/k's go.mod as the module proxy serves it (``go mod download -json`` -> ``GoMod``)."""
    plain_env = {k: v for k, v in env.items() if k != "GOFLAGS"}
    command = [go, "mod", "download", "-json", f"k8s.io/kubernetes@v{version}"]
    result = subprocess.run(command, cwd=workdir, env=plain_env, capture_output=True, text=True)
    if result.returncode != 0:
        raise KubeApiserverBuildError(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    info = json.loads(result.stdout)
    if "GoMod" not in info:
        raise KubeApiserverBuildError(f"{' '.join(command)} printed no GoMod path: {info}")
    return Path(info["GoMod"]).read_text(encoding="utf-8")


def _count_dependencies(go: str, workdir: Path, env: Mapping[str, str]) -> int:
    command = [go, "list", f"-tags={BUILD_TAGS}", "-deps", _MAIN_PACKAGE]
    result = subprocess.run(
        command, cwd=workdir, env={**env, "CGO_ENABLED": "0"}, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise KubeApiserverBuildError(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")
    return len(result.stdout.split())


def _run_counting(
    command: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    out: TextIO,
    counts: Callable[[str], bool],
    label: str,
) -> None:
    """Run ``command`` streaming its stderr as a live count; on failure raise with the output tail."""
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
                    _say(out, f"      {count} {label} ...")
                    last_report = now
        returncode = process.wait()
    if interactive:
        out.write("\r")
    _say(out, f"      {count} {label}")
    if returncode != 0:
        joined = "\n".join(tail)
        raise KubeApiserverBuildError(
            f"`{' '.join(command)}` exited with {returncode}; last output:\n{joined}"
        )


def _check_version(binary: Path, version: str) -> None:
    result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    if f"v{version}" not in result.stdout:
        raise KubeApiserverBuildError(
            f"built binary reports {result.stdout.strip() or result.stderr.strip()!r}, expected v{version}"
        )


def _say(out: TextIO, message: str) -> None:
    out.write(message + "\n")
    out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.kube_apiserver_build``: ensure the binary, print its path and the build cost."""
    parser = argparse.ArgumentParser(prog="python -m harness.kube_apiserver_build", description=main.__doc__)
    parser.add_argument(
        "--version", default=KUBERNETES_VERSION, help="Kubernetes release (default %(default)s)"
    )
    args = parser.parse_args(argv)
    try:
        result = ensure_kube_apiserver(args.version)
    except (KubeApiserverBuildError, BinaryNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(result.path)
    if result.build_seconds is None:
        print(f"no build needed (binary from {result.source})")
    else:
        print(
            f"built in {result.build_seconds:.1f} s; "
            f"peak RSS of the largest build process {result.peak_rss_mib:.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
