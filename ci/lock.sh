#!/usr/bin/env bash
# Refresh the Python lock files from pyproject.toml. Run it after changing a dependency, then commit
# requirements/*.txt. The set-up (ci/setup.sh), CI and the container image install ONLY from these
# files, with hashes, so a fresh machine gets exactly the versions that were tested.
#   requirements/epp.txt  the EPP's runtime dependencies (+ setuptools to build its wheel): the image
#   requirements/dev.txt  the harness, the test tools and the build backend: set-up and CI
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
PIP_TOOLS_VERSION=7.6.2
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"$PYTHON" -m venv "$tools"
"$tools/bin/python" -m pip install --quiet "pip-tools==$PIP_TOOLS_VERSION"

# `--unsafe-package inference-epp` keeps the project itself (the test extra names
# `inference-epp[harness]`) out of the lock while setuptools stays pinned with its hashes.
compile() {
    "$tools/bin/pip-compile" --quiet --generate-hashes --strip-extras --no-emit-index-url \
        --no-emit-find-links --unsafe-package inference-epp "$@" pyproject.toml
}
mkdir -p requirements
echo "==> requirements/epp.txt"
compile --build-deps-for wheel -o requirements/epp.txt
echo "==> requirements/dev.txt"
# Constrained by the runtime lock, so the EPP is tested with exactly the versions its image ships.
compile --build-deps-for editable --extra test --constraint requirements/epp.txt -o requirements/dev.txt
echo "==> requirements/mutation.txt"
# mutmut and what it adds on top of the dev lock (installed into .venv by benchmarks/mutation.py only).
compile --extra mutation --constraint requirements/dev.txt -o requirements/mutation.txt
