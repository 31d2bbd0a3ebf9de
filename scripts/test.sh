#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls `make test`, which calls this).
# Lint and the import-layer contracts first (seconds); then `agentrl dev prepare` builds or
# installs everything the tests need (the control plane and node binaries from pinned Go
# modules, cached under ~/.cache/agentrl; seconds once cached) as its own step, so no test
# spends its timeout on a build; then every test: unit tests, tests against the real
# kube-apiserver, and the e2e suites.
set -uo pipefail
cd "$(dirname "$0")/.."

ruff check operator tests e2e bench || exit 1
lint-imports || exit 1

# Everything the suite needs, built before pytest starts; stops here naming what is missing.
agentrl dev prepare || exit 1

python3 -m pytest -q -p no:cacheprovider --durations=25 "$@"
status=$?
# pytest exits 5 when it collected no test at all: that is a broken suite, not a pass.
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$status"
