#!/usr/bin/env bash
# The test command: sets up the machine, type-checks the tree, then runs every test (unit, integration against a
# real Apache Kafka broker, interop with real clients). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# mypy, configured in pyproject.toml ([tool.mypy]); incremental (cache in .venv), a few seconds once warm.
if ! .venv/bin/python -m mypy; then
  echo "type check failed (mypy, above): fix the errors or run '.venv/bin/python -m mypy' to see them again" >&2
  exit 1
fi
.venv/bin/python -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
