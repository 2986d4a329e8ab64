#!/usr/bin/env bash
# The README's test command: set up, lint, type-check, check layering, then every test tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
# helm, for the chart tests only, built up front: its cold build (about 3 minutes) would eat most of
# the first chart test's 300 s timeout.
echo "==> ensuring helm (for the chart tests)"
.venv/bin/harness build --helm

echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> mypy (epp, harness)"
.venv/bin/mypy
echo "==> import layering"
.venv/bin/lint-imports
echo "==> hadolint (Containerfile)"
.venv/bin/hadolint Containerfile
echo "==> actionlint (docs/ci: the workflow we publish for EPP repositories)"
.venv/bin/python ci/actionlint.py

echo "==> pytest (unit, integration, e2e) with 2 workers"
set +e
.venv/bin/pytest -n 2 --durations=25 "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: that is a failure for CI, never a pass.
exit $rc
