"""Cold and warm builds of the harness's images: the Debian base (debootstrap), the wheelhouse base,
the EPP image (the Containerfile) and the Envoy image, with the harness's own dockerd.

``--cold`` points the image cache at an empty temporary directory first (debootstrap from the
Debian mirror, pip download from the index or pip's cache, both docker builds); without it, the
run uses the harness cache as it is. Each round then starts a second engine, as the next run would,
and times how long the cached images take to be ready in it (the warm path: a tarball loaded).

    .venv/bin/python benchmarks/bench_images.py [--cold]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from harness.base.binaries import CACHE_ENV, cache_root
from harness.cluster.container_engine import DockerEngine
from harness.dataplane.envoy_container import envoy_image
from harness.nodeagent.image_builds import EppImageBuild


def _one_engine(label: str) -> None:
    began = time.monotonic()
    with DockerEngine() as engine:
        started = time.monotonic() - began
        epp = EppImageBuild().ensure(engine)
        envoy = envoy_image(engine)
        print(f"{label}: dockerd ready in {started:.1f} s")
        for ready in (*epp.bases, epp.epp, envoy):
            print(f"  {ready.tag:<62} {ready.how:<8} {ready.seconds:6.1f} s")
        stopping = time.monotonic()
    print(f"  engine stopped in {time.monotonic() - stopping:.1f} s; total {time.monotonic() - began:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="start from an empty image cache")
    args = parser.parse_args()
    scratch = None
    if args.cold:
        scratch = tempfile.mkdtemp(prefix="epp-bench-images-")
        os.environ[CACHE_ENV] = scratch
    try:
        print(f"image cache: {cache_root() / 'images'}; load average {os.getloadavg()[0]:.1f}")
        _one_engine("first engine (cold)" if args.cold else "first engine")
        _one_engine("second engine (warm)")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
