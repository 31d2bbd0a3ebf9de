#!/usr/bin/env bash
# The test suite in its two tiers: `make test` (what CI runs: .ci/run calls it) and
# `make test-fast`.
#
#   bash scripts/test.sh [--fast] [pytest arguments]
#
# Whole suite: ruff and the import-layer contracts (seconds); mypy --strict over the typed
# packages ([tool.mypy] in pyproject.toml: the API with its wire contract, the reconcile layer);
# `agentrl dev prepare`, which builds or installs everything the tests need (the control plane
# and node binaries from pinned Go modules, the SGLang environment, the images, the node's
# packages; cached under ~/.cache/agentrl, seconds once cached) as its own step, so no test
# spends its timeout on a build; then every test: unit tests, tests against the real
# kube-apiserver and the real node, contracts with the real SGLang, the e2e suites.
#
# --fast: lint and mypy, then only the unit tests of pure code (`-m "not prepared"`: the marker
# tests/tiers.py sets on every test that needs what prepare builds). No prepare, and pytest runs
# with an empty cache (XDG_CACHE_HOME, GOMODCACHE) and no AGENTRL_DEV_BIN_DIR,
# KUBEBUILDER_ASSETS or AGENTRL_TEST_KUBECONFIG: a test that reaches a prepared product fails
# there on every machine instead of passing on one that happens to have it.
#
# pytest prints the 25 slowest tests and fails a test over its time budget unless it is on
# tests/slow_tests.txt; this script prints each step's wall time at the end, pass or fail.
set -uo pipefail
cd "$(dirname "$0")/.."

tier=all
if [ "${1:-}" = "--fast" ]; then
  tier=fast
  shift
fi

started=$SECONDS
times=()
scratch=""

# step NAME COMMAND...: run COMMAND and record its wall time under NAME.
step() {
  local name=$1 t0=$SECONDS rc
  shift
  "$@"
  rc=$?
  times+=("$name $((SECONDS - t0))s")
  return "$rc"
}

finish() {
  local total=$((SECONDS - started)) joined=""
  [ "${#times[@]}" -gt 0 ] && printf -v joined '%s, ' "${times[@]}"
  echo "scripts/test.sh ($tier) wall time: ${joined}total ${total}s" \
    "($((total / 60)) min $((total % 60)) s)" >&2
  if [ -n "$scratch" ]; then
    chmod -R u+w "$scratch" 2>/dev/null
    rm -rf "$scratch"
  fi
}
trap finish EXIT

lint() {
  ruff check operator tests e2e bench && lint-imports
}

step lint lint || exit 1
step mypy mypy || exit 1

if [ "$tier" = all ]; then
  # Everything the suite needs, built before pytest starts; stops here naming what is missing.
  step prepare agentrl dev prepare || exit 1
  step pytest python3 -m pytest -q -p no:cacheprovider --durations=25 "$@"
  status=$?
else
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/agentrl-test-fast.XXXXXX")
  step pytest env -u AGENTRL_DEV_BIN_DIR -u KUBEBUILDER_ASSETS -u AGENTRL_TEST_KUBECONFIG \
    XDG_CACHE_HOME="$scratch/cache" GOMODCACHE="$scratch/gomodcache" \
    python3 -m pytest -q -p no:cacheprovider --durations=25 -m "not prepared" "$@"
  status=$?
fi

# pytest exits 5 when it collected no test at all: that is a broken suite, not a pass.
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$status"
