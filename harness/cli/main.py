"""``harness`` command line: ``up`` (a local control plane until Ctrl-C) and ``build`` (the Go binaries).

Further subcommands (``demo``, ``replay``) plug in without editing this file: a module
``harness.<name>`` that defines ``HELP: str``, ``configure_parser(parser)`` and ``run(args) -> int``
is listed automatically when it exists.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Final

from harness.base.binaries import kubectl_path
from harness.cluster import go_binaries, releases
from harness.cluster.controlplane import FULL, MINIMAL, ControlPlane, ControlPlaneStartError

if TYPE_CHECKING:
    from harness.cluster.container_engine import DockerEngine
    from harness.subject.chart_install import ChartInstall

PLUGGABLE_COMMANDS: Final = {
    "demo": "harness.cli.demo",
    "replay": "harness.scenarios.replay",
    "bench": "harness.cli.bench",
    "conformance": "harness.cli.conformance",
    "assets": "harness.cli.assets",
}
_WATCH_INTERVAL: Final = 0.5
CONTAINERS_ENV: Final = "EPP_HARNESS_CONTAINERS"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description="Hermetic Kubernetes harness for the EPP.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser(
        "up",
        help="run a control plane (etcd, kube-apiserver, scheduler, controller-manager, CRDs) until Ctrl-C",
    )
    up.add_argument(
        "--no-crds", action="store_true", help="do not install the InferencePool/InferenceModel CRDs"
    )
    up.add_argument(
        "--crd-release",
        metavar="VERSION",
        help="CRDs of this sigs.k8s.io/gateway-api-inference-extension release: "
        f"{', '.join(releases.RELEASES)} (default: ${releases.CRD_RELEASE_ENV}, else "
        f"{releases.DEFAULT_CRD_RELEASE})",
    )
    up.add_argument(
        "--minimal", action="store_true", help="etcd + kube-apiserver only (no scheduler, no controllers)"
    )
    up.add_argument("--write-kubeconfig", type=Path, metavar="PATH", help="also copy the kubeconfig to PATH")
    up.add_argument(
        "--with-epp",
        action="store_true",
        help="also run the demo's pool and models, 4 simulated pods, the EPP and Envoy (see `harness demo`)",
    )
    up.add_argument(
        "--pool",
        metavar="[NAMESPACE/]NAME",
        help="with --with-epp: no demo pool; the EPP and Envoy serve this pool, which you apply with kubectl "
        "(examples/cluster/vllm-sim.yaml defines vllm-llama3-8b-instruct)",
    )
    up.add_argument(
        "--epp-command",
        metavar="CMD",
        help="with --with-epp: run this EPP instead of ours: a command line taking upstream's flag names "
        "(quoted), 'upstream[:vX.Y.Z]' (built by `harness build --upstream-epp`) or 'ours'",
    )
    up.add_argument(
        "--deploy",
        action="store_true",
        help="also install deploy/chart with `helm install` (EPP pods run by the node agent), "
        "examples/cluster/vllm-sim.yaml's model servers, and Envoy in front of the EPP pods",
    )
    up.add_argument(
        "--replicas", type=int, default=2, metavar="N", help="with --deploy: the chart's EPP replicas (2)"
    )
    up.add_argument(
        "--containers",
        action="store_true",
        default=os.environ.get(CONTAINERS_ENV, "") not in ("", "0"),
        help="a container engine of the harness's own for the node agent: our images run as real "
        "containers; with --deploy the EPP pods are the image built from this checkout's Containerfile "
        f"(built or loaded first; env {CONTAINERS_ENV}=1)",
    )
    up.add_argument(
        "--backend",
        choices=("harness", "kind"),
        default="harness",
        help="the cluster: the harness's own plane (default), or kind (built from Go modules, pinned; its "
        "node image built here: see README 'The container tier'), in the harness's container engine",
    )
    up.set_defaults(handler=cmd_up)

    build = commands.add_parser(
        "build", help="ensure etcd, kube-apiserver, kube-scheduler, kube-controller-manager (build if needed)"
    )
    go_binaries.add_arguments(build)
    build.set_defaults(handler=cmd_build)

    for name, module_name in PLUGGABLE_COMMANDS.items():
        module = _optional_command(module_name)
        if module is not None:
            sub = commands.add_parser(name, help=str(getattr(module, "HELP", "")))
            module.configure_parser(sub)
            sub.set_defaults(handler=module.run)
    return parser


def cmd_build(args: argparse.Namespace) -> int:
    if args.epp_source is not None:
        return go_binaries.build_epp_source(args.epp_source)
    argv = ["--upstream-epp", args.upstream_epp] if args.upstream_epp else []
    return go_binaries.main([*argv, *(["--helm"] if args.helm else [])])


def cmd_up(args: argparse.Namespace) -> int:
    """Start the control plane, print how to reach it, wait for SIGINT/SIGTERM, stop, exit 0.

    Exit 1 if the start fails or a component dies while up; 130 if interrupted before it was ready.
    """
    try:
        release = args.crd_release or releases.default_release()
        releases.check_release(release)
    except releases.UnknownReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The session's release: what the EPP is told (its pool group) and what the examples speak.
    os.environ[releases.CRD_RELEASE_ENV] = release
    note = None if args.no_crds else releases.supplement_note(release)
    if note:
        print(f"note: {note}", flush=True)
    if args.backend == "kind":
        from harness.cli.up_kind import up_kind

        return up_kind(args)
    if args.with_epp:
        from harness.cli.demo import up_with_epp

        return up_with_epp(args)
    if args.pool or args.epp_command:
        print("error: --pool and --epp-command go with --with-epp", file=sys.stderr)
        return 2
    if args.deploy and args.minimal:
        print(
            "error: --deploy needs the full plane (the controller-manager makes the EPP pods)",
            file=sys.stderr,
        )
        return 2
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if args.containers and args.minimal:
        print("error: --containers needs the node agent (the full plane)", file=sys.stderr)
        return 2
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    stack = contextlib.ExitStack()
    engine: DockerEngine | None = None
    epp_image: str | None = None
    if args.containers:
        try:
            engine, epp_image = _start_containers(args.deploy)
        except (Exception, KeyboardInterrupt) as exc:  # no engine, an image that would not build, ^C
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if isinstance(exc, KeyboardInterrupt):
                print("interrupted before the container engine was ready; stopped", file=sys.stderr)
                return 130
            print(f"error: the container tier cannot run: {exc}", file=sys.stderr)
            return 1
    plane = ControlPlane(
        components=MINIMAL if args.minimal else FULL,
        install_crds=not args.no_crds,
        crd_release=args.crd_release,
        container_engine=engine.dir if engine is not None else None,
    )
    try:
        try:
            plane.start()  # a signal during start unwinds through start()'s rollback
        except ControlPlaneStartError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted before the control plane was ready; stopped", file=sys.stderr)
            return 130
        if args.deploy:
            try:
                deployment = _deploy(plane, args.replicas, stack, epp_image)
            except KeyboardInterrupt:
                print("interrupted before the chart was installed; stopped", file=sys.stderr)
                return 130
            except Exception as exc:  # helm, kubectl or a pod that never got Ready: say which, stop
                print(f"error: installing the chart failed: {exc}", file=sys.stderr)
                return 1
        for sig in previous:
            signal.signal(sig, request_stop)
        _print_access(plane, args.write_kubeconfig, last=not args.deploy)
        if args.deploy:
            _print_deployment(deployment, plane)
        while not stop_requested.wait(_WATCH_INTERVAL):
            dead = plane.dead_processes()
            if dead:
                print(f"error: {', '.join(dead)} exited unexpectedly; stopping", file=sys.stderr)
                print(plane.log_tails(40), file=sys.stderr)
                return 1
        print("stopping ...", flush=True)
        return 0
    finally:
        try:
            stack.close()  # the release, its Envoy and its work directory, before the plane
        finally:
            try:
                plane.stop()
            finally:
                if engine is not None:
                    engine.stop()  # after the plane: the node agent removes its containers first
                for sig, handler in previous.items():
                    signal.signal(sig, handler)


def _start_containers(deploy: bool) -> tuple[DockerEngine, str | None]:
    """The engine (on the kept data root) and, for --deploy, the EPP image built from this checkout."""
    import time

    from harness.cluster.container_images import kept_engine
    from harness.nodeagent.image_builds import EppImageBuild

    began = time.monotonic()
    engine = kept_engine()
    print(f"container engine: dockerd, data root {engine.data_root} ({time.monotonic() - began:.1f} s)",
          flush=True)  # fmt: skip
    if not deploy:
        return engine, None
    try:
        print("EPP image from the Containerfile (a first build takes minutes) ...", flush=True)
        built = EppImageBuild().ensure(engine)
    except BaseException:
        engine.stop()
        raise
    print(f"EPP image:  {built.tag} ({built.epp.how}, {built.seconds:.1f} s)", flush=True)
    return engine, built.tag


def _deploy(
    plane: ControlPlane, replicas: int, stack: contextlib.ExitStack, epp_image: str | None = None
) -> ChartInstall:
    from harness.subject.chart_install import ChartInstall, ChartOptions

    work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="harness-deploy-")))
    runs = f"the image {epp_image} as containers" if epp_image else "processes from this virtualenv"
    print(f"installing deploy/chart ({replicas} EPP replicas: {runs}) with helm ...", flush=True)
    options = ChartOptions(replicas=replicas)
    if epp_image is not None:
        options = ChartOptions(replicas=replicas, epp_image=epp_image)
    install = ChartInstall(plane.access, "default", work_dir, options)
    stack.enter_context(install)
    return install


def _print_deployment(install: ChartInstall, plane: ControlPlane) -> None:
    helm = shlex.quote(str(install.helm.binary))
    kubeconfig = shlex.quote(str(plane.kubeconfig_path))
    pods = ", ".join(
        f"{p['metadata']['name']} ({p['status'].get('podIP')})" for p in install.serving_epp_pods()
    )
    release, namespace = install.options.release, install.namespace
    print(f"chart:      release {release} in namespace {namespace}; "
          f"{helm} --kubeconfig {kubeconfig} -n {namespace} status {release}")  # fmt: skip
    print(f"EPP pods:   {pods} (ext_proc :9002, gRPC health :9003, /metrics :9090)")
    print(f"envoy:      {install.envoy.base_url if install.envoy else ''} (ext_proc to every EPP pod above)")
    print("models:     meta-llama/Llama-3.1-8B-Instruct, food-review")
    print(f"export OPENAI_BASE_URL={install.base_url} OPENAI_API_KEY=unused")
    print("Press Ctrl-C to stop.", flush=True)


def _print_access(plane: ControlPlane, copy_to: Path | None, last: bool = True) -> None:
    kubeconfig = plane.kubeconfig_path
    if copy_to is not None:
        shutil.copyfile(kubeconfig, copy_to)
        copy_to.chmod(0o600)
        kubeconfig = copy_to.resolve()
    kinds = ",".join(
        (
            "inferencepools",
            *releases.generation_of(plane.crd_release or releases.default_release()).model_plurals,
        )
    )
    what = f"get {kinds} --all-namespaces" if plane.crds_installed else "get namespaces"
    command = f"{shlex.quote(str(kubectl_path()))} --kubeconfig {shlex.quote(str(kubeconfig))} {what}"
    crds = "CRDs installed" if plane.crds_installed else "no CRDs"
    print(f"control plane is up ({', '.join(plane.components)}; {crds})", flush=True)
    print(f"server:     {plane.server_url}")
    print(f"kubeconfig: {kubeconfig}")
    print(f"kubectl:    {command}")
    if plane.access.node_agent_url:
        print(
            f"pods:       {plane.nodes} nodes run by the node agent; {plane.access.node_agent_url}/debug/pods"
        )
    if last:
        print("Press Ctrl-C to stop.", flush=True)


def _optional_command(module_name: str) -> ModuleType | None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return None
    if not (hasattr(module, "configure_parser") and hasattr(module, "run")):
        return None
    return module


if __name__ == "__main__":
    sys.exit(main())
