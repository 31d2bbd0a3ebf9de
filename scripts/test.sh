#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls `make test`, which calls this).
# Lint and the import-layer contracts first (seconds), then every test: unit tests, tests
# against the real kube-apiserver (the control plane is built from pinned Go modules into
# ~/.cache/agentrl on first use, then reused), and the e2e suites.
set -uo pipefail
cd "$(dirname "$0")/.."

ruff check operator tests e2e bench || exit 1
lint-imports || exit 1

python3 -m pytest -q -p no:cacheprovider "$@"
status=$?
# pytest exits 5 when it collected no test at all: that is a broken suite, not a pass.
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$status"
