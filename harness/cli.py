"""``harness`` command line: ``up`` (a local control plane until Ctrl-C) and ``build`` (the Go binaries).

Further subcommands (``demo``, ``replay``) plug in without editing this file: a module
``harness.<name>`` that defines ``HELP: str``, ``configure_parser(parser)`` and ``run(args) -> int``
is listed automatically when it exists.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import Final

from harness import go_binaries
from harness.binaries import kubectl_path
from harness.controlplane import FULL, MINIMAL, ControlPlane, ControlPlaneStartError

PLUGGABLE_COMMANDS: Final = ("demo", "replay", "bench")
_WATCH_INTERVAL: Final = 0.5


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
        help="CRDs of this sigs.k8s.io/gateway-api-inference-extension release (default: the pinned one)",
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
    up.set_defaults(handler=cmd_up)

    build = commands.add_parser(
        "build", help="ensure etcd, kube-apiserver, kube-scheduler, kube-controller-manager (build if needed)"
    )
    go_binaries.add_arguments(build)
    build.set_defaults(handler=cmd_build)

    for name in PLUGGABLE_COMMANDS:
        module = _optional_command(name)
        if module is not None:
            sub = commands.add_parser(name, help=str(getattr(module, "HELP", "")))
            module.configure_parser(sub)
            sub.set_defaults(handler=module.run)
    return parser


def cmd_build(args: argparse.Namespace) -> int:
    argv = ["--upstream-epp", args.upstream_epp] if args.upstream_epp else []
    return go_binaries.main([*argv, *(["--helm"] if args.helm else [])])


def cmd_up(args: argparse.Namespace) -> int:
    """Start the control plane, print how to reach it, wait for SIGINT/SIGTERM, stop, exit 0.

    Exit 1 if the start fails or a component dies while up; 130 if interrupted before it was ready.
    """
    if args.with_epp:
        from harness.demo import up_with_epp

        return up_with_epp(args)
    if args.pool:
        print("error: --pool goes with --with-epp", file=sys.stderr)
        return 2
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    plane = ControlPlane(
        components=MINIMAL if args.minimal else FULL,
        install_crds=not args.no_crds,
        crd_release=args.crd_release,
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
        for sig in previous:
            signal.signal(sig, request_stop)
        _print_access(plane, args.write_kubeconfig)
        while not stop_requested.wait(_WATCH_INTERVAL):
            dead = plane.dead_processes()
            if dead:
                print(f"error: {', '.join(dead)} exited unexpectedly; stopping", file=sys.stderr)
                print(plane.log_tails(40), file=sys.stderr)
                return 1
        print("stopping ...", flush=True)
        return 0
    finally:
        plane.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_access(plane: ControlPlane, copy_to: Path | None) -> None:
    kubeconfig = plane.kubeconfig_path
    if copy_to is not None:
        shutil.copyfile(kubeconfig, copy_to)
        copy_to.chmod(0o600)
        kubeconfig = copy_to.resolve()
    what = "get inferencepools,inferencemodels --all-namespaces" if plane.crds_installed else "get namespaces"
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
    print("Press Ctrl-C to stop.", flush=True)


def _optional_command(name: str) -> ModuleType | None:
    module_name = f"harness.{name}"
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
