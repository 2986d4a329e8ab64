"""The pinned Go-built binaries of the harness, declared for ``harness.cluster.gobuild``; the
``harness build`` entry.

Kubernetes: kube-apiserver, kube-scheduler and kube-controller-manager from one ``k8s.io/kubernetes``
release, in one wrapper module and one ``go build`` (they share most packages, so building the
second and third costs little more than linking). ``go install k8s.io/kubernetes/cmd/...@vX``
cannot work: k/k requires its staging modules at ``v0.0.0`` and maps them to ``./staging/...`` with
``replace`` lines that only apply inside k/k itself. Each staging module is also published as
``v0.Y.Z`` for ``v1.Y.Z``, so the wrapper replaces every one of them; the list is derived from k/k's
own go.mod (fetched through the ordinary ``go`` client), never typed by hand, because it changes
between releases (1.36 added two). The build mirrors the official one (static, trimpath,
``selinux,notest,grpcnotrace`` tags, ``-s -w``) and stamps the version variables so ``/version``
reports the pinned release instead of ``v0.0.0-master``.

etcd: the 3.6 release that Kubernetes 1.36 is tested with (controller-tools' envtest matrix pairs
1.36 with etcd 3.6.8), built from ``go.etcd.io/etcd/server/v3`` (whose ``main`` calls
``etcdmain.Main``) in its own wrapper module, never in the Kubernetes one. etcd >= 3.5.13 is what
lets kube-apiserver turn on RequestWatchProgress and consistent reads from the watch cache.

The upstream EPP (``sigs.k8s.io/gateway-api-inference-extension``, ``./cmd/epp``), on request only
(``harness build --upstream-epp v0.3.0``; plain ``harness build`` and CI never build it): the
comparison point for conformance and speed. ``go install ...@v0.3.0`` fails through this proxy (it
refuses the module's ``@v/list``, which go install reads for deprecation notices), but the module's
go.mod has no ``replace`` lines, so the plain wrapper module builds it. It has no version flag, so
its pin is checked in the build information Go embeds (``mod\t<module>\tv0.3.0``). Cached as
``<cache>/upstream-epp/v0.3.0/upstream-epp``; ``$TEST_ASSET_UPSTREAM_EPP`` points elsewhere. From
v1.6.0 the module has no ``./cmd/epp`` any more: the same name is its lightweight reference EPP,
``./cmd/lwepp`` (the full one moved to llm-d-router, which ``harness build --epp-source DIR`` builds
from a checkout, `harness.cluster.source_build`).

helm (``helm.sh/helm/v3``, ``./cmd/helm``) for the chart checks and ``harness up --deploy``: its go.mod
has no ``replace`` lines, so the plain wrapper module builds it, in a module of its own (it requires
the Kubernetes client libraries of its own release, not ours). Stamped as helm's Makefile does:
``internal/version.version`` (so ``helm version --short`` reports the pin) and the Kubernetes version
that ``helm lint`` and ``.Capabilities.KubeVersion`` assume (client-go's minor, major + 1). Not in
``BUILDS``: the tests that need it build it on demand (``helm_path()``) and ``harness build --helm``
builds it up front; ``$TEST_ASSET_HELM`` points elsewhere.

Adding a binary is one ``GoBuild`` declaration here plus its entry in ``BUILDS`` (built by
``harness build``) or a function like ``upstream_epp_build`` (built on request).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TextIO

from harness.base.binaries import BinaryNotFoundError
from harness.cluster import gobuild, source_build
from harness.cluster.gobuild import BuildContext, GoBinary, GoBuild, Resolved

KUBERNETES_VERSION: Final = "1.36.3"
ETCD_VERSION: Final = "3.6.8"

KUBERNETES_BUILD_TAGS: Final = "selinux,notest,grpcnotrace"
_VERSION_PACKAGES: Final = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
_STAGING_RE: Final = re.compile(
    r"^\s*(?:replace\s+)?(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/(k8s\.io/[\w.-]+)\s*$", re.MULTILINE
)


# --------------------------------------------------------------------------- Kubernetes specifics


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The staging modules k/k maps to ``./staging/src/<module>``, in go.mod order."""
    return [m.group(1) for m in _STAGING_RE.finditer(kubernetes_go_mod) if m.group(1) == m.group(2)]


def godebug_lines(go_mod: str) -> list[str]:
    """The ``godebug`` directives (single lines and blocks) verbatim, for runtime parity with upstream."""
    lines: list[str] = []
    in_block = False
    for line in go_mod.splitlines():
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


def kubernetes_go_mod_extra(context: BuildContext) -> list[str]:
    """k/k's godebug lines and one staging replace per module (``k8s.io/api => k8s.io/api v0.36.3``)."""
    modules = staging_modules(context.upstream_go_mod)
    if not modules:
        raise gobuild.GoBuildError(
            "found no './staging/src/k8s.io/...' replace lines in k8s.io/kubernetes go.mod"
        )
    staging_version = "v0." + context.version.split(".", 1)[1]
    debug = godebug_lines(context.upstream_go_mod)
    return [*debug, *([""] if debug else []), "replace (",
            *(f"\t{m} => {m} {staging_version}" for m in modules), ")"]  # fmt: skip


def kubernetes_ldflags(context: BuildContext) -> str:
    """``-ldflags`` as upstream's ``kube::version::ldflags`` sets them, for both version packages."""
    major, minor = context.version.split(".")[:2]
    values = {
        "gitVersion": f"v{context.version}",
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": context.build_date.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if context.commit:
        values["gitCommit"] = context.commit
    flags = ["-s", "-w"]
    for package in _VERSION_PACKAGES:
        flags += [f"-X {package}.{name}={value}" for name, value in values.items()]
    return " ".join(flags)


def etcd_ldflags(context: BuildContext) -> str:
    """As etcd's ``build.sh``: stamp the commit when the proxy told us which one the tag is."""
    flags = "-s -w"
    if context.commit:
        flags += f" -X go.etcd.io/etcd/api/v3/version.GitSHA={context.commit[:7]}"
    return flags


def _kubernetes_binary(name: str) -> GoBinary:
    return GoBinary(
        name, f"k8s.io/kubernetes/cmd/{name}", ("--version",), f"Kubernetes v{KUBERNETES_VERSION}"
    )


# --------------------------------------------------------------------------- declarations

KUBE_APISERVER: Final = _kubernetes_binary("kube-apiserver")
KUBE_SCHEDULER: Final = _kubernetes_binary("kube-scheduler")
KUBE_CONTROLLER_MANAGER: Final = _kubernetes_binary("kube-controller-manager")

KUBERNETES: Final = GoBuild(
    name="kubernetes",
    module="k8s.io/kubernetes",
    version=KUBERNETES_VERSION,
    binaries=(KUBE_APISERVER, KUBE_SCHEDULER, KUBE_CONTROLLER_MANAGER),
    ldflags=kubernetes_ldflags,
    tags=KUBERNETES_BUILD_TAGS,
    go_mod_extra=kubernetes_go_mod_extra,
)

ETCD: Final = GoBuild(
    name="etcd",
    module="go.etcd.io/etcd/server/v3",
    version=ETCD_VERSION,
    binaries=(
        GoBinary("etcd", "go.etcd.io/etcd/server/v3", ("--version",), f"etcd Version: {ETCD_VERSION}"),
    ),
    ldflags=etcd_ldflags,
)

HELM_VERSION: Final = "3.19.0"
_CLIENT_GO_RE: Final = re.compile(r"^\s*k8s\.io/client-go\s+v(\d+)\.(\d+)\.", re.MULTILINE)


def helm_ldflags(context: BuildContext) -> str:
    """As helm's Makefile: the release in ``internal/version`` and client-go's Kubernetes version.

    client-go ``v0.34.x`` is Kubernetes 1.34, which ``helm lint`` and ``helm template`` then assume
    for ``.Capabilities.KubeVersion`` (the Makefile computes major as 0 + 1 the same way).
    """
    flags = ["-s", "-w", f"-X helm.sh/helm/v3/internal/version.version=v{context.version}"]
    flags.append("-X helm.sh/helm/v3/internal/version.gitTreeState=clean")
    if context.commit:
        flags.append(f"-X helm.sh/helm/v3/internal/version.gitCommit={context.commit}")
    match = _CLIENT_GO_RE.search(context.upstream_go_mod)
    if match is not None:
        major, minor = str(int(match.group(1)) + 1), match.group(2)
        for package in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
            flags += [f"-X {package}.k8sVersionMajor={major}", f"-X {package}.k8sVersionMinor={minor}"]
    return " ".join(flags)


HELM: Final = GoBuild(
    name="helm",
    module="helm.sh/helm/v3",
    version=HELM_VERSION,
    binaries=(GoBinary("helm", "helm.sh/helm/v3/cmd/helm", ("version", "--short"), f"v{HELM_VERSION}"),),
    ldflags=helm_ldflags,
)

# h2spec, the HTTP/2 conformance suite run against our ext_proc server (tests/integration/
# test_h2spec.py): a pre-modules release, so its go.mod is the proxy's one-line stand-in: the wrapper
# gets a go directive of its own and pins the dependencies h2spec imports (else -mod=mod would take
# whatever is newest). It has no stamped version (it prints 2.0.0): proven by its build info.
H2SPEC_VERSION: Final = "2.2.1+incompatible"
_H2SPEC_DEPENDENCIES: Final = (
    "github.com/fatih/color v1.19.0",
    "github.com/mattn/go-colorable v0.1.14",
    "github.com/mattn/go-isatty v0.0.20",
    "github.com/spf13/cobra v1.10.2",
    "github.com/spf13/pflag v1.0.9",
    "golang.org/x/net v0.62.0",
    "golang.org/x/sys v0.49.0",
    "golang.org/x/text v0.43.0",
)
H2SPEC: Final = GoBuild(
    name="h2spec",
    module="github.com/summerwind/h2spec",
    version=H2SPEC_VERSION,
    binaries=(
        GoBinary(
            "h2spec",
            "github.com/summerwind/h2spec/cmd/h2spec",
            (),
            f"mod\tgithub.com/summerwind/h2spec\tv{H2SPEC_VERSION}\t",
        ),
    ),
    go_mod_extra=lambda _context: ["require (", *(f"\t{d}" for d in _H2SPEC_DEPENDENCIES), ")"],
    legacy_go="1.21",
)


def h2spec_path(progress: TextIO | None = None) -> Path:
    """The pinned h2spec, built into the cache if needed (about a minute cold, once)."""
    return gobuild.ensure(H2SPEC, progress)["h2spec"].path


BUILDS: Final = (ETCD, KUBERNETES)
"""Everything ``harness build`` ensures, in this order."""

UPSTREAM_EPP_MODULE: Final = "sigs.k8s.io/gateway-api-inference-extension"
UPSTREAM_EPP_VERSION: Final = "0.3.0"
"""The release the harness compares against (its CRDs are the ones the control plane installs)."""


LIGHTWEIGHT_EPP_SINCE: Final = (1, 6)
"""From v1.6.0 the module ships no full EPP, only the lightweight reference one (``./cmd/lwepp``:
round robin, no metrics); the full EPP moved to llm-d-router (``harness build --epp-source``)."""


def upstream_epp_package(version: str) -> str:
    """The EPP's main package in the module at ``version``: ``./cmd/epp``, or ``./cmd/lwepp`` from v1.6.0."""
    parsed = gobuild.parse_go_version(version.removeprefix("v"))
    lightweight = parsed is not None and parsed[:2] >= LIGHTWEIGHT_EPP_SINCE
    return f"{UPSTREAM_EPP_MODULE}/cmd/{'lwepp' if lightweight else 'epp'}"


def upstream_epp_build(version: str = UPSTREAM_EPP_VERSION) -> GoBuild:
    """Upstream's Go EPP at ``version`` ("0.3.0" or "v0.3.0"): one binary, ``upstream-epp`` (the
    lightweight ``./cmd/lwepp`` from v1.6.0, see ``upstream_epp_package``)."""
    version = version.removeprefix("v")
    return GoBuild(
        name="upstream-epp",
        module=UPSTREAM_EPP_MODULE,
        version=version,
        binaries=(
            GoBinary(
                "upstream-epp",
                upstream_epp_package(version),
                (),  # no version flag: proven by the embedded build info
                f"mod\t{UPSTREAM_EPP_MODULE}\tv{version}\t",
            ),
        ),
    )


def upstream_epp_path(version: str = UPSTREAM_EPP_VERSION, progress: TextIO | None = None) -> Path:
    """The upstream EPP binary, built into the cache if needed (about 4 minutes cold)."""
    build = upstream_epp_build(version)
    return gobuild.ensure(build, progress)[build.binaries[0].name].path


def find_upstream_epp(version: str = UPSTREAM_EPP_VERSION) -> Path | None:
    """The upstream EPP binary if it is already built (or given by ``$TEST_ASSET_UPSTREAM_EPP``)."""
    build = upstream_epp_build(version)
    found = gobuild.find(build, build.binaries[0])
    return None if found is None else found.path


def helm_path(progress: TextIO | None = None) -> Path:
    """The pinned helm, built into the cache if needed (about 3 minutes cold, once)."""
    return gobuild.ensure(HELM, progress)["helm"].path


def _build_of(name: str) -> GoBuild:
    for build in BUILDS:
        if any(binary.name == name for binary in build.binaries):
            return build
    raise KeyError(f"no pinned Go binary named {name!r}")


def binary_path(name: str, progress: TextIO | None = None) -> Path:
    """The path of pinned binary ``name`` (building its whole group into the cache if needed)."""
    return gobuild.ensure(_build_of(name), progress)[name].path


def missing_binaries() -> list[str]:
    """Binaries that would have to be built (none found in the environment or the cache)."""
    return [b.name for build in BUILDS for b in build.binaries if gobuild.find(build, b) is None]


def ensure_all(progress: TextIO | None = None) -> dict[str, Resolved]:
    """Every pinned binary, built where needed, in ``BUILDS`` order."""
    results: dict[str, Resolved] = {}
    for build in BUILDS:
        results.update(gobuild.ensure(build, progress))
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``harness build`` (shared with ``harness.cli.main``)."""
    parser.add_argument(
        "--upstream-epp",
        metavar="VERSION",
        help=f"also build upstream's Go EPP ({UPSTREAM_EPP_MODULE} ./cmd/epp; from v1.6.0 its lightweight "
        f"./cmd/lwepp) at VERSION, e.g. v{UPSTREAM_EPP_VERSION} (never built otherwise)",
    )
    parser.add_argument(
        "--epp-source",
        metavar="DIR",
        type=Path,
        help="build ./cmd/epp of the Go module checked out at DIR (e.g. llm-d-router) into the harness "
        "cache and print only its path (for `harness conformance --epp-command PATH`)",
    )
    parser.add_argument(
        "--helm",
        action="store_true",
        help=f"also build helm v{HELM_VERSION} (otherwise built on first use by the chart tests)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``harness build``: ensure every pinned binary; one line per binary with its path and origin."""
    parser = argparse.ArgumentParser(prog="harness build", description=main.__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.epp_source is not None:
        return build_epp_source(args.epp_source)
    wanted = list(BUILDS)
    if args.helm:
        wanted.append(HELM)
    if args.upstream_epp:
        wanted.append(upstream_epp_build(args.upstream_epp))
    try:
        results = ensure_all(sys.stderr)
        for build in wanted[len(BUILDS) :]:
            results.update(gobuild.ensure(build, sys.stderr))
    except (gobuild.GoBuildError, gobuild.BinaryVersionError, BinaryNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    builds: dict[float, list[str]] = {}
    for build in wanted:
        for binary in build.binaries:
            result = results[binary.name]
            print(f"{binary.name:<24} v{build.version:<8} {result.source:<6} {result.path}")
            if result.build_seconds is not None:
                builds.setdefault(result.build_seconds, []).append(binary.name)
    if not builds:
        print("no build needed")
    for seconds, names in builds.items():
        rss = results[names[0]].peak_rss_mib or 0
        print(f"built {', '.join(names)} in {seconds:.1f} s (peak RSS of the largest process {rss:.0f} MiB)")
    return 0


def build_epp_source(directory: Path, out: TextIO | None = None) -> int:
    """``harness build --epp-source DIR``: progress on stderr, the binary's path alone on stdout."""
    progress = sys.stderr if out is None else out
    try:
        built = source_build.build_from_source(directory, progress)
    except (gobuild.GoBuildError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    what = "cached" if built.build_seconds is None else f"built in {built.build_seconds:.1f} s"
    print(f"{built.revision.module} {built.revision.revision}: {what}", file=progress)
    print(built.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
