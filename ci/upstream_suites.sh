#!/usr/bin/env bash
# Upstream's own Go suites on the harness's binaries (issue 19): gateway-api-inference-extension
# v1.5.0's test/integration/epp (the full EPP in-process against envtest) and v1.6.0's test/cel (the
# InferencePool CRD's validation rules), with KUBEBUILDER_ASSETS=$(harness assets).
#
#   ci/upstream_suites.sh [integration|cel|envtest ...]     (default: all three)
#
# envtest: ci/envtest-smoke, the smallest controller-runtime envtest program (start, write and read
# an object, stop) on the same assets.
#
# The module cache is read-only, so each module is copied out to a scratch directory first; its test
# dependencies come through the Go module proxy and build with the ordinary Go build cache. GOWORK=off:
# a module zip holds no nested modules (v1.4.0+ list conformance/ in go.work).
set -euo pipefail
cd "$(dirname "$0")/.."
MODULE=sigs.k8s.io/gateway-api-inference-extension
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(integration cel envtest)

assets=$(.venv/bin/harness assets)
echo "==> KUBEBUILDER_ASSETS=$assets"
scratch=$(mktemp -d -t upstream-suites-XXXXXX)
module_copy() {  # module_copy VERSION -> a writable copy of the module's source
    local dir
    dir=$(GOFLAGS=-mod=mod go mod download -json "$MODULE@$1" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    cp -r "$dir" "$scratch/$1"
    chmod -R u+w "$scratch/$1"
    echo "$scratch/$1"
}

# test/cel insists on downloading envtest's binaries unless KUBECONFIG names a cluster: it gets a
# harness cluster (etcd + kube-apiserver) with v1.6.0's CRDs, as `harness up` runs it.
up_pid=
with_cluster() {  # with_cluster RELEASE: start `harness up --minimal`, export KUBECONFIG once it serves
    .venv/bin/harness up --minimal --crd-release "$1" --write-kubeconfig "$scratch/kubeconfig" \
        > "$scratch/up.log" 2>&1 &
    up_pid=$!
    for _ in $(seq 1 600); do
        grep -q 'Press Ctrl-C' "$scratch/up.log" && { export KUBECONFIG="$scratch/kubeconfig"; return 0; }
        kill -0 "$up_pid" 2>/dev/null || break
        sleep 0.2
    done
    cat "$scratch/up.log" >&2
    return 1
}
stop_cluster() {
    if [ -n "$up_pid" ]; then kill -INT "$up_pid" 2>/dev/null || true; wait "$up_pid" || true; up_pid=; fi
    unset KUBECONFIG
}
trap 'stop_cluster; chmod -R u+w "$scratch" 2>/dev/null; rm -rf "$scratch"' EXIT

status=0
for suite in "${suites[@]}"; do
    if [ "$suite" = envtest ]; then
        echo "==> ci/envtest-smoke: go run ."
        start=$(date +%s)
        if (cd ci/envtest-smoke && KUBEBUILDER_ASSETS="$assets" GOTOOLCHAIN=local GOFLAGS=-mod=mod go run .); then
            echo "==> envtest: passed in $(( $(date +%s) - start )) s"
        else
            echo "==> envtest: FAILED"; status=1
        fi
        continue
    fi
    case "$suite" in
        integration) version=v1.5.0; package=./test/integration/epp/... ;;
        cel) version=v1.6.0; package=./test/cel/... ;;
        *) echo "unknown suite $suite (integration, cel, envtest)" >&2; exit 2 ;;
    esac
    source=$(module_copy "$version")
    if [ "$suite" = cel ]; then with_cluster "$version"; fi
    echo "==> $MODULE@$version: go test $package"
    start=$(date +%s)
    if (cd "$source" && KUBEBUILDER_ASSETS="$assets" GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod go test -count=1 "$package" -v 2>&1 \
            | tee "$scratch/$suite.log" | grep -E '^(=== RUN|--- (PASS|FAIL|SKIP)|PASS|FAIL|ok|Ran )' ); then :; fi
    stop_cluster
    passed=$(grep -c -- '--- PASS' "$scratch/$suite.log" || true)
    failed=$(grep -c -- '--- FAIL' "$scratch/$suite.log" || true)
    echo "==> $suite ($MODULE@$version): $passed passed, $failed failed in $(( $(date +%s) - start )) s"
    if [ "$failed" -ne 0 ] || ! grep -qE '^ok ' "$scratch/$suite.log"; then
        tail -40 "$scratch/$suite.log"
        status=1
    fi
done
exit $status
