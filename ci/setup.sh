#!/usr/bin/env bash
# Idempotent environment set-up shared by the demo and the test commands:
# a venv in .venv with exactly the locked dependencies (requirements/dev.txt, hashes checked) and
# the project itself, then the Go-built binaries (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager), taken from $TEST_ASSET_<NAME>, $KUBEBUILDER_ASSETS or the harness cache,
# else built from Go modules once.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv with $PYTHON"
    "$PYTHON" -m venv .venv
fi

# Reinstall only when the lock or the project metadata changed.
stamp=.venv/.installed-$(cat requirements/dev.txt pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
    echo "==> installing the locked dependencies (requirements/dev.txt) and the project into .venv"
    .venv/bin/python -m pip install --quiet --require-hashes -r requirements/dev.txt
    # The project itself: no dependency resolution (the lock has them all) and no isolated build
    # environment (setuptools comes from the lock too), so nothing unpinned is downloaded.
    .venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
    rm -f .venv/.installed-*
    touch "$stamp"
fi

echo "==> ensuring the control-plane binaries (the first build from Go modules takes a few minutes)"
# etcd and the Kubernetes binaries only: what the demo needs. The test command builds helm on top
# (ci/test.sh), for the chart tests alone.
.venv/bin/harness build
