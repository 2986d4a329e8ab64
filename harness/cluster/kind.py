"""The kind backend: ``kind`` from Go modules (pinned), a node image built here, ``kind create cluster``.

On a machine with registry access kind runs its published node image (``kindest/node``). Here no
registry is reachable, so the node image has to be built locally, and ``KindCluster.start()`` goes
step by step, stopping with ``KindUnavailable`` (the step, the command, the tool's own error) at the
first one that cannot be done on this machine; ``harness up --backend kind`` prints it and the kind
test skips with it:

1. ``kind`` v0.33.0 from the Go module proxy (``harness.cluster.gobuild``; cached like helm).
2. The node image: ``kind build node-image --type file`` over a Kubernetes server tarball laid out as
   a release's (``kubernetes/server/bin/`` with kubeadm, kubelet, kubectl and the control-plane
   image tarballs, ``kubernetes/version``), on a base image of ours (``--base-image``), against the
   harness's engine. What stops it is recorded in ``KindUnavailable`` verbatim.
3. ``kind create cluster --image <node image>`` against the harness's engine, then ``kind load
   docker-image`` of our images, and the chart.

Everything kind makes it makes through the harness's own engine (``DOCKER_HOST`` of
``harness.cluster.container_engine``), never the system's, and ``stop()`` deletes the cluster.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from harness.base.lifecycle import StartStop
from harness.base.process import temp_prefix
from harness.cluster import gobuild
from harness.cluster.container_engine import DockerEngine
from harness.cluster.container_images import DebianBase, base_image
from harness.cluster.go_binaries import (
    KUBERNETES_BUILD_TAGS,
    KUBERNETES_VERSION,
    binary_path,
    kubernetes_go_mod_extra,
    kubernetes_ldflags,
)
from harness.cluster.gobuild import GoBinary, GoBuild

KIND_VERSION: Final = "0.33.0"
KIND: Final = GoBuild(
    name="kind",
    module="sigs.k8s.io/kind",
    version=KIND_VERSION,
    binaries=(GoBinary("kind", "sigs.k8s.io/kind", ("version",), f"kind v{KIND_VERSION}"),),
)
_K8S: Final = f"v{KUBERNETES_VERSION}"


def _node_binary(name: str, *version_args: str) -> GoBinary:
    expected = _K8S if version_args != ("--version",) else f"Kubernetes {_K8S}"
    return GoBinary(name, f"k8s.io/kubernetes/cmd/{name}", version_args, expected)


NODE_BINARIES: Final = GoBuild(
    name="kubernetes-node",
    module="k8s.io/kubernetes",
    version=KUBERNETES_VERSION,
    binaries=(
        _node_binary("kubeadm", "version", "-o", "short"),
        _node_binary("kubelet", "--version"),
        _node_binary("kube-proxy", "--version"),
        _node_binary("kubectl", "version", "--client"),
    ),
    ldflags=kubernetes_ldflags,
    tags=KUBERNETES_BUILD_TAGS,
    go_mod_extra=kubernetes_go_mod_extra,
)
"""What a node image needs of the pinned Kubernetes beyond the harness's plane (same release, same build)."""
NODE_IMAGE: Final = f"epp-harness/kind-node:v{KUBERNETES_VERSION}"
_KIND_TIMEOUT_S: Final = 900.0
# What `kind build node-image --type file` reads from a release tarball (kind's builder_tarball.go).
_SERVER_BINARIES: Final = ("kubeadm", "kubelet", "kubectl", "kube-proxy")
_SERVER_IMAGES: Final = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")


class KindUnavailable(RuntimeError):
    """A step of the kind backend cannot be done here; the message names the step, command, error."""


@dataclass(frozen=True)
class Step:
    name: str
    command: tuple[str, ...]
    output: str
    code: int


def kind_path() -> Path:
    try:
        return gobuild.ensure(KIND)["kind"].path
    except gobuild.GoBuildError as exc:
        raise KindUnavailable(f"building kind v{KIND_VERSION} from Go modules failed: {exc}") from exc


class KindCluster(StartStop):
    """A kind cluster in the harness's engine (see the module doc); ``kubeconfig`` once started."""

    def __init__(
        self, engine: DockerEngine, name: str = "epp-harness", node_image: str | None = None
    ) -> None:
        self.engine = engine
        self.name = name
        self.node_image = node_image
        self.steps: list[Step] = []
        self._work = Path(tempfile.mkdtemp(prefix=temp_prefix("kind")))
        self.kubeconfig = self._work / "kubeconfig"
        self._created = False

    def _start(self) -> None:
        kind = kind_path()
        image = self.node_image or self.build_node_image(kind)
        self._run("create cluster", kind, "create", "cluster", "--name", self.name, "--image", image,
                  "--kubeconfig", str(self.kubeconfig), "--wait", "120s")  # fmt: skip
        self._created = True

    def build_node_image(self, kind: Path) -> str:
        """``kind build node-image --type file`` over a server tarball of the pinned Kubernetes."""
        tarball = self._server_tarball()
        base = DebianBase().tag
        self._run("build node-image", kind, "build", "node-image", "--type", "file", "--image", NODE_IMAGE,
                  "--base-image", base, str(tarball))  # fmt: skip
        return NODE_IMAGE

    def _server_tarball(self) -> Path:
        """``kubernetes/server/bin`` as a release lays it out: kubeadm, kubelet, kubectl (and
        kube-proxy) from ``NODE_BINARIES``, the control plane's from the harness's own build, each
        image a layer over the Debian base with the binary as its ENTRYPOINT, saved as
        ``<name>.tar`` with its ``<name>.docker_tag``; ``kubernetes/version``."""
        try:
            built = {name: resolved.path for name, resolved in gobuild.ensure(NODE_BINARIES).items()}
            for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
                built[name] = binary_path(name)
        except gobuild.GoBuildError as exc:
            raise KindUnavailable(
                f"build node-image: building the node's Kubernetes binaries failed: {exc}"
            ) from exc
        base = base_image(self.engine).tag
        root = self._work / "release"
        bin_dir = root / "kubernetes" / "server" / "bin"
        bin_dir.mkdir(parents=True)
        (root / "kubernetes" / "version").write_text(f"v{KUBERNETES_VERSION}\n")
        for name in _SERVER_BINARIES:
            shutil.copy2(built[name], bin_dir / name)
        for name in _SERVER_IMAGES:
            tag = f"registry.k8s.io/{name}-amd64:v{KUBERNETES_VERSION}"
            context = self._work / f"{name}-context"
            context.mkdir()
            shutil.copy2(built[name], context / name)
            (context / "Containerfile").write_text(
                f'FROM {base}\nCOPY {name} /usr/local/bin/{name}\nENTRYPOINT ["/usr/local/bin/{name}"]\n'
            )
            dockerfile = context / "Containerfile"
            self.engine.docker("build", "--network", "none", "-t", tag, "-f", dockerfile, context,
                               timeout=_KIND_TIMEOUT_S)  # fmt: skip
            self.engine.docker("save", "-o", bin_dir / f"{name}.tar", tag, timeout=_KIND_TIMEOUT_S)
            (bin_dir / f"{name}.docker_tag").write_text(f"v{KUBERNETES_VERSION}\n")
        archive = self._work / "kubernetes-server-linux-amd64.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(root / "kubernetes", arcname="kubernetes")
        return archive

    def _run(self, step: str, *command: str | Path) -> str:
        argv = tuple(str(c) for c in command)
        result = subprocess.run(argv, env=self.engine.env(), capture_output=True, text=True,
                                timeout=_KIND_TIMEOUT_S, check=False)  # fmt: skip
        output = (result.stdout + result.stderr).strip()
        self.steps.append(Step(step, argv, output, result.returncode))
        if result.returncode != 0:
            raise KindUnavailable(f"{step}: `{' '.join(argv)}` exited {result.returncode}:\n{output[-3000:]}")
        return output

    def load_images(self, tags: Sequence[str]) -> None:
        for tag in tags:
            self._run("load docker-image", kind_path(), "load", "docker-image", tag, "--name", self.name)

    def stop(self) -> None:
        try:
            if self._created:
                with contextlib.suppress(KindUnavailable, subprocess.TimeoutExpired):
                    self._run("delete cluster", kind_path(), "delete", "cluster", "--name", self.name)
                self._created = False
        finally:
            subprocess.run(["rm", "-rf", str(self._work)], check=False)
