#!/usr/bin/env bash
# Idempotent environment set-up shared by the demo and the test commands:
# a venv in .venv with the project and its test extras, then the Go-built binaries (etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager), taken from $TEST_ASSET_<NAME>,
# $KUBEBUILDER_ASSETS or the harness cache, else built from Go modules once.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv with $PYTHON"
    "$PYTHON" -m venv .venv
fi

# Reinstall only when the dependency list changed.
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
    echo "==> installing the project and its dependencies into .venv"
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test]'
    rm -f .venv/.installed-*
    touch "$stamp"
fi

echo "==> ensuring the control-plane binaries (the first build from Go modules takes a few minutes)"
.venv/bin/harness build
