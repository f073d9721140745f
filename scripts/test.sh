#!/usr/bin/env bash
# The test command: sets up the machine, then runs every test (unit, integration against a real Apache Kafka
# broker, interop with real clients). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
