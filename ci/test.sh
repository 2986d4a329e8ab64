#!/usr/bin/env bash
# The README's test command: set up, lint, type-check, check layering, then every test tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
# helm, for the chart tests only, built up front: its cold build (about 3 minutes) would eat most of
# the first chart test's 300 s timeout.
echo "==> ensuring helm (for the chart tests)"
.venv/bin/harness build --helm

# What runs twice, once per API generation (the scenarios; see the end).
V1_SCENARIOS=(
    tests/integration/scenarios
    tests/integration/routing
    tests/e2e/test_any_epp.py
    tests/e2e/test_kubectl.py
    tests/e2e/test_load_shedding.py
    tests/e2e/test_openai_api.py
    tests/e2e/test_pod_lifecycle.py
    tests/e2e/test_target_ports.py
    tests/e2e/test_pool_resync.py
    tests/e2e/test_pool_boundaries.py
    tests/e2e/test_optional_kinds.py
    tests/e2e/test_what_reaches_the_model_server.py
    tests/e2e/test_v1_protocol.py
    tests/integration/chart
    tests/e2e/test_demo.py
)

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

echo "==> pytest (unit, integration, e2e) with 2 workers, on v0.3.0's CRDs (API generation v1alpha2)"
set +e
.venv/bin/pytest -n 2 --durations=25 "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: that is a failure for CI, never a pass.
[ "$rc" -eq 0 ] || exit $rc

# The scenario suite again on v1.5.0's CRDs (API generation v1): the same descriptions rendered as
# InferencePool v1, InferenceModelRewrite and InferenceObjective (README: "One scenario, both API
# generations"). Only the scenarios, the chart's CI checks (v1 pool, its Role and flags: ~45 s) and
# the demo (~50 s): the rest of the tiers (CRD schemas, the chart installed for real, node agent, h2,
# faults) is about one generation or none, or costs more than a minute again (the chart install
# ~2.5 min, harness up ~3.5 min, the EPP faults ~1.5 min pass on v1.5.0 too:
# `.venv/bin/pytest --crd-release v1.5.0 <file>`), and the CI budget has room for one pass of it.
echo "==> pytest: the scenarios on v1.5.0's CRDs (API generation v1)"
exec .venv/bin/pytest -n 2 --durations=10 --crd-release v1.5.0 "${V1_SCENARIOS[@]}"
