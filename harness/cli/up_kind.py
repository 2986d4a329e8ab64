"""``harness up --backend kind``: a kind cluster in the harness's container engine, until Ctrl-C.

The engine (``harness.cluster.container_images.kept_engine``), then ``harness.cluster.kind.KindCluster``:
kind built from Go modules, the node image built here, ``kind create cluster --image``, our images
loaded (``kind load docker-image``). Where a step cannot be done on this machine it stops there and
prints the step, the command and the tool's own error (``KindUnavailable``), exit 1; the engine is
stopped either way.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from harness.cluster.container_engine import EngineUnavailable


def up_kind(args: argparse.Namespace) -> int:
    from harness.cluster.container_images import kept_engine
    from harness.cluster.kind import KindCluster, KindUnavailable
    from harness.nodeagent.image_builds import EppImageBuild
    from harness.nodeagent.sim_image import SimImageBuild

    if args.deploy or args.with_epp or args.minimal:
        print("error: --backend kind takes no --deploy, --with-epp or --minimal (yet)", file=sys.stderr)
        return 2
    try:
        engine = kept_engine()
    except EngineUnavailable as exc:
        print(f"error: no container engine: {exc}", file=sys.stderr)
        return 1
    cluster = KindCluster(engine)
    try:
        try:
            print("kind cluster: building kind, the node image, then `kind create cluster` ...", flush=True)
            cluster.start()
            images = [EppImageBuild().ensure(engine).tag, SimImageBuild().ensure(engine).tag]
            cluster.load_images(images)
        except KindUnavailable as exc:
            print(f"error: the kind backend stopped at {exc}", file=sys.stderr)
            return 1
        print(f"kubeconfig: {cluster.kubeconfig} (kind cluster {cluster.name}; images {', '.join(images)})")
        print("Press Ctrl-C to stop.", flush=True)
        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            stop.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0
    finally:
        try:
            cluster.stop()
        finally:
            engine.stop()
