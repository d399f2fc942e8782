#!/usr/bin/env bash
# Set up .venv and run every check CI runs: generated code up to date, lint, the whole test suite.
#   bash scripts/test.sh                 # everything (about 5-10 minutes on 2 cores)
#   bash scripts/test.sh -k sharded      # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${APEXRL_VENV:-.venv}
echo "== generated protobuf code"
"$VENV/bin/python" protos/generate.py --check
echo "== generated settings table (docs/settings.md)"
"$VENV/bin/python" scripts/settings_doc.py --check
echo "== generated dashboards and PrometheusRule (monitoring/grafana/build.py)"
"$VENV/bin/python" monitoring/grafana/build.py --check
echo "== generated metrics reference (docs/metrics.md)"
"$VENV/bin/python" scripts/metrics_doc.py --check
echo "== ruff"
"$VENV/bin/ruff" check .
echo "== ruff format"
"$VENV/bin/ruff" format --check .
echo "== pytest"
exec "$VENV/bin/python" -m pytest "$@"
