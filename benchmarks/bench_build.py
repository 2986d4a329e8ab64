"""Cold build of the Go-built binaries: every pinned binary together, or kube-apiserver alone.

Each run gets empty Go module, Go build and harness caches (temporary directories, removed
afterwards), so the module download and every compile are included; the machine's own caches are
not touched. Prints wall time and the peak RSS of the largest build process; asserts nothing.

    .venv/bin/python benchmarks/bench_build.py              # etcd + the three Kubernetes binaries
    .venv/bin/python benchmarks/bench_build.py --only kube-apiserver
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

_BUILD_ONE = """
import dataclasses, sys
from harness.cluster import go_binaries, gobuild
name = sys.argv[1]
build = next(b for b in go_binaries.BUILDS if any(x.name == name for x in b.binaries))
gobuild.ensure(dataclasses.replace(build, binaries=(build.binary(name),)))
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", metavar="BINARY", help="build just this binary (default: all of them)")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-build-"))
    env = {**os.environ}
    for variable in ("GOCACHE", "GOMODCACHE", "EPP_HARNESS_CACHE"):
        env[variable] = str(scratch / variable.lower())
    for variable in [v for v in env if v.startswith("TEST_ASSET_")] + ["KUBEBUILDER_ASSETS"]:
        env.pop(variable, None)
    if args.only:
        command = [sys.executable, "-c", _BUILD_ONE, args.only]
    else:
        command = [sys.executable, "-m", "harness.cluster.go_binaries"]
    try:
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True)
        seconds = time.perf_counter() - started
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        modules = _size(scratch / "gomodcache") / 2**20
        what = args.only or "every pinned binary"
        print(f"cold build of {what}: {seconds:.0f} s ({seconds / 60:.1f} min); peak RSS {rss:.0f} MiB; "
              f"Go module cache {modules:.0f} MiB")  # fmt: skip
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(scratch)], check=False)  # the module cache is read-only
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and not p.is_symlink())


if __name__ == "__main__":
    sys.exit(main())
