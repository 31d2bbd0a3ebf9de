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
# spends its timeout on a build; then every test in two pytest runs: the unit tests of pure code
# on every core (the --fast tier's tests), then the rest (`prepared or slow`), one test at a
# time. With STREAMS=2 (the default on 4 cores or more) the rest runs as two streams side by
# side, one pytest each: the cluster stream (`-m cluster_stream`: the session's kube-apiserver
# and real node, the e2e suites), which mostly waits on pods and watches, and the local stream
# (Ray, the trainer, `agentrl run`, servers, contracts with the real SGLang), which mostly
# computes; tests/tiers.py marks the cluster stream's tests at collection, and the local
# stream's output follows the cluster stream's. With pytest arguments, one run of what they
# name.
#
# --fast: lint and mypy, then only the unit tests of pure code (`-m "not prepared and not
# slow"`: `prepared` is the marker tests/tiers.py sets on every test that needs what prepare
# builds; `slow` marks the tests that start processes — Ray, a server, the trainer, `agentrl
# run` — or train). They run on every core (pytest-xdist, WORKERS, default auto), and a test
# not marked slow that takes over UNIT_BUDGET seconds (default 20) fails, naming the marker: the
# tier stays fast as tests are added. No prepare, and pytest runs with an empty cache
# (XDG_CACHE_HOME, GOMODCACHE) and no AGENTRL_DEV_BIN_DIR, KUBEBUILDER_ASSETS or
# AGENTRL_TEST_KUBECONFIG: a test that reaches a prepared product fails there on every machine
# instead of passing on one that happens to have it.
#
# pytest prints the 25 slowest tests and fails a test over its time budget unless it is on
# tests/slow_tests.txt; this script prints each step's wall time at the end, pass or fail, with the
# CPU time the whole machine was busy meanwhile (/proc/stat): busy / cores is the least wall time
# that running the step's work side by side could reach.
set -uo pipefail
cd "$(dirname "$0")/.."

tier=all
WORKERS=${WORKERS:-auto}
# two streams side by side where the cores allow: measured on 2 cores they saved 4 of 50 min
# and slowed the cluster stream's e2e tests by 25-60 %, so a 2-core machine (CI) runs one
STREAMS=${STREAMS:-$( [ "$(nproc)" -ge 4 ] && echo 2 || echo 1 )}
UNIT_BUDGET=${UNIT_BUDGET:-20}
if [ "${1:-}" = "--fast" ]; then
  tier=fast
  shift
fi

started=$SECONDS
times=()
scratch=""
local_pid=""

# The machine's busy CPU time so far, in clock ticks (/proc/stat: user, nice, system, irq,
# softirq, steal; every process counted, the cluster's and its containers' included).
TICKS=$(getconf CLK_TCK 2>/dev/null || echo 100)
CORES=$(nproc)
cpu_busy() {
  local _cpu user nice system _idle _iowait irq softirq steal _rest
  read -r _cpu user nice system _idle _iowait irq softirq steal _rest </proc/stat
  echo $((user + nice + system + irq + softirq + steal))
}
busy0=$(cpu_busy)

# step NAME COMMAND...: run COMMAND and record its wall time under NAME, with the CPU time the
# machine was busy meanwhile: a step's wall time can shrink by running its work side by side
# only down to busy / cores.
step() {
  local name=$1 t0=$SECONDS b0 rc wall busy
  b0=$(cpu_busy)
  shift
  "$@"
  rc=$?
  wall=$((SECONDS - t0))
  busy=$((($(cpu_busy) - b0) / TICKS))
  times+=("$name ${wall}s (CPU busy ${busy} core-s, $((100 * busy / (CORES * (wall > 0 ? wall : 1))))% of $CORES cores)")
  return "$rc"
}

finish() {
  local total=$((SECONDS - started)) joined="" busy=$((($(cpu_busy) - busy0) / TICKS))
  if [ -n "$local_pid" ] && kill -0 "$local_pid" 2>/dev/null; then
    kill "$local_pid" 2>/dev/null  # interrupted: the local stream stops with the script
    wait "$local_pid" 2>/dev/null
  fi
  [ "${#times[@]}" -gt 0 ] && printf -v joined '%s, ' "${times[@]}"
  echo "scripts/test.sh ($tier) wall time: ${joined}total ${total}s" \
    "($((total / 60)) min $((total % 60)) s; CPU busy ${busy} core-s, at least" \
    "$((busy / CORES / 60)) min $((busy / CORES % 60)) s on $CORES cores)" >&2
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
  if [ "$#" -gt 0 ]; then
    step pytest python3 -m pytest -q -p no:cacheprovider --durations=25 "$@"
    status=$?
  else
    # The unit tests of pure code (make test-fast's) on every core, then the rest in their
    # two streams: they start clusters, nodes, Ray and servers that share the machine's cores.
    step unit python3 -m pytest -q -p no:cacheprovider --durations=10 \
      -m "not prepared and not slow" -n "$WORKERS"
    unit=$?
    if [ "$STREAMS" -gt 1 ]; then
      # the local stream in the background, its output kept until the cluster stream is done
      scratch=$(mktemp -d "${TMPDIR:-/tmp}/agentrl-test.XXXXXX")
      (
        t0=$SECONDS
        python3 -m pytest -q -p no:cacheprovider --durations=25 \
          -m "(prepared or slow) and not cluster_stream" >"$scratch/local.log" 2>&1
        rc=$?
        echo "$((SECONDS - t0))" >"$scratch/local.seconds"
        exit "$rc"
      ) &
      local_pid=$!
      step cluster-stream python3 -m pytest -q -p no:cacheprovider --durations=25 \
        -m "(prepared or slow) and cluster_stream"
      status=$?
      wait "$local_pid"
      local_status=$?
      times+=("local-stream $(cat "$scratch/local.seconds" 2>/dev/null || echo '?')s")
      echo "---------------- the local stream (pytest -m \"(prepared or slow) and not" \
        "cluster_stream\") ----------------"
      cat "$scratch/local.log"
      if [ "$local_status" -eq 5 ]; then
        status=5
      elif [ "$status" -eq 0 ]; then
        status=$local_status
      fi
    else
      step pytest python3 -m pytest -q -p no:cacheprovider --durations=25 -m "prepared or slow"
      status=$?
    fi
    if [ "$unit" -eq 5 ] || [ "$status" -eq 5 ]; then
      status=5
    elif [ "$status" -eq 0 ]; then
      status=$unit
    fi
  fi
else
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/agentrl-test-fast.XXXXXX")
  step pytest env -u AGENTRL_DEV_BIN_DIR -u KUBEBUILDER_ASSETS -u AGENTRL_TEST_KUBECONFIG \
    XDG_CACHE_HOME="$scratch/cache" GOMODCACHE="$scratch/gomodcache" \
    python3 -m pytest -q -p no:cacheprovider --durations=25 -m "not prepared and not slow" \
    --unit-budget "$UNIT_BUDGET" -n "$WORKERS" "$@"
  status=$?
fi

# pytest exits 5 when it collected no test at all: that is a broken suite, not a pass.
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$status"
