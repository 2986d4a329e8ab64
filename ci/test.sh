#!/usr/bin/env bash
# The README's test command: set up, lint, type-check, check layering, then every test tier.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
# helm, for the chart tests only, built up front: its cold build (about 3 minutes) would eat most of
# the first chart test's 300 s timeout.
echo "==> ensuring helm (for the chart tests)"
.venv/bin/harness build --helm

# What runs twice, once per API generation: every integration and e2e test that creates pools,
# models, objectives or routes a request (README: "One scenario, both API generations"). The rest is
# about one generation or none: unit tests, CRD schemas, the control plane, node agent, h2 and h2spec,
# packaging, the container tier, the routing benchmark's smoke run.
V1_SCENARIOS=(
    tests/integration/scenarios
    tests/integration/routing
    tests/integration/churn
    tests/integration/replay
    tests/integration/faults
    tests/integration/chart
    tests/e2e/test_any_epp.py
    tests/e2e/test_app_protocol.py
    tests/e2e/test_black_box_oracle.py
    tests/e2e/test_body_limit.py
    tests/e2e/test_chart_install.py
    tests/e2e/test_demo.py
    tests/e2e/test_destination_header.py
    tests/e2e/test_epp_faults.py
    tests/e2e/test_epp_restart.py
    tests/e2e/test_gateway_conformance.py
    tests/e2e/test_in_flight.py
    tests/e2e/test_kubectl.py
    tests/e2e/test_kubectl_deployment.py
    tests/e2e/test_load_shedding.py
    tests/e2e/test_lora_affinity.py
    tests/e2e/test_openai_api.py
    tests/e2e/test_pod_lifecycle.py
    tests/e2e/test_optional_crds_absent.py
    tests/e2e/test_optional_kinds.py
    tests/e2e/test_pool_boundaries.py
    tests/e2e/test_pool_resync.py
    tests/e2e/test_prefix_affinity.py
    tests/e2e/test_target_ports.py
    tests/e2e/test_up_with_epp.py
    tests/e2e/test_v1_fallbacks.py
    tests/e2e/test_v1_protocol.py
    tests/e2e/test_what_reaches_the_model_server.py
    tests/e2e/test_what_reaches_the_model_server_full_duplex.py
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

# Both passes at once. Most of a test's time is spent waiting (for a watch, a pod, a settle), so on
# 2 cores the suite uses well under half the CPU with two workers: five workers in two sessions (each
# with its own control plane and CRDs) finish in about half the time of the passes one after the other.
# The v1 pass writes to a log printed when both are done; `worksteal` keeps a long test from leaving
# the other workers idle at the end.
echo "==> pytest, two passes at once: everything on v0.3.0's CRDs (API generation v1alpha2, 3 workers,"
echo "    with the container tier),"
echo "    and the scenarios again on v1.5.0's CRDs (API generation v1, 2 workers)"
v1_log=$(mktemp "${TMPDIR:-/tmp}/epp-ci-v1-pass.XXXXXX")
.venv/bin/pytest -n 2 --dist worksteal --durations=15 --crd-release v1.5.0 "${V1_SCENARIOS[@]}" \
    >"$v1_log" 2>&1 &
v1_pid=$!
# An interrupted run stops the v1 pass too and leaves no log behind. `|| true`: by the time a finished
# run exits, the v1 pass is already reaped and kill fails, which under `set -e` would turn a green run's
# exit status into 1.
trap 'kill "$v1_pid" 2>/dev/null || true; rm -f "$v1_log"' EXIT
set +e
# --containers: the container tier (our own dockerd; the EPP, Envoy and simulator images built from
# this checkout and cached by content; chart pods as containers), README "Real containers".
.venv/bin/pytest -n 3 --dist worksteal --durations=25 --containers "$@"
rc=$?
wait "$v1_pid"
v1_rc=$?
set -e
echo "==> pytest: the scenarios on v1.5.0's CRDs (API generation v1), run beside the pass above"
cat "$v1_log"
# pytest exit 5 = no tests collected: that is a failure for CI, never a pass.
[ "$rc" -eq 0 ] || exit $rc
exit $v1_rc
