#!/usr/bin/env bash
# Set up .venv and run every check CI runs: generated code up to date, lint, the whole test suite.
#   bash scripts/test.sh                 # everything (set-up, checks, ~1,600 tests; README "Testing" has the figures)
#   bash scripts/test.sh --quick         # iteration: every package's unit tests and ruff, ~2 minutes, no set-up
#                                        # when .venv exists
#   bash scripts/test.sh -k sharded      # extra arguments go to pytest
# The end of the run prints the total time and the slowest tests; a test over its time budget fails the run
# (tests/support/time_budget.py, budgets in tests/time_budgets.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${APEXRL_VENV:-.venv}
started=$SECONDS
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
if [ "$quick" = 0 ] || [ ! -x "$VENV/bin/python" ]; then
  bash scripts/setup.sh
fi
set_up=$((SECONDS - started))
if [ "$quick" = 0 ]; then
  echo "== generated protobuf code"
  "$VENV/bin/python" protos/generate.py --check
  echo "== generated settings table (docs/settings.md)"
  "$VENV/bin/python" scripts/settings_doc.py --check
  echo "== generated dashboards and PrometheusRule (monitoring/grafana/build.py)"
  "$VENV/bin/python" monitoring/grafana/build.py --check
  echo "== generated metrics reference (docs/metrics.md)"
  "$VENV/bin/python" scripts/metrics_doc.py --check
fi
echo "== ruff"
"$VENV/bin/ruff" check .
echo "== ruff format"
"$VENV/bin/ruff" format --check .
checked=$((SECONDS - started))
echo "== pytest"
status=0
if [ "$quick" = 1 ]; then
  "$VENV/bin/python" -m pytest tests/unit -q -p no:cacheprovider "$@" || status=$?
else
  # Two workers: half of a run's wall time is spent waiting on processes, sockets and disks, not on the CPUs.
  # APEXRL_TEST_WORKERS=0 runs it in this one process.
  workers=${APEXRL_TEST_WORKERS:-2}
  xdist=()
  [ "$workers" -gt 0 ] && xdist=(-n "$workers")
  "$VENV/bin/python" -m pytest "${xdist[@]}" "$@" || status=$?
fi
echo "scripts/test.sh: $((SECONDS - started)) s in all (set-up $set_up s, checks $((checked - set_up)) s," \
  "pytest $((SECONDS - checked)) s), exit $status"
exit "$status"
