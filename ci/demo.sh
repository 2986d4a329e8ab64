#!/usr/bin/env bash
# The README's main-job command: set up, then run the end-to-end demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
exec .venv/bin/harness demo "$@"
