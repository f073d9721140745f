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
# Compiled bytecode is kept (__pycache__, ignored by git) even where the environment says not to write it: else
# every pytest worker and every coordinator subprocess compiles the project again, and pytest rewrites every test
# module's asserts again (collecting the suite: ~11 s of CPU instead of ~3 s).
unset PYTHONDONTWRITEBYTECODE
# PYTEST_WORKERS=2: two pytest-xdist workers (CI's machine has 2 cores), each with its own session broker, each
# handed whole test modules (tests/conftest.py, xdist_unit) in collection order (--no-loadscope-reorder: Spark's
# tests last, as tests/analytics/conftest.py orders them). One process by default until two full runs in a row
# have passed with two workers.
xdist=()
if [ "${PYTEST_WORKERS:-0}" != 0 ]; then
  xdist=(-n "$PYTEST_WORKERS" --no-loadscope-reorder)
fi
.venv/bin/python -m pytest "${xdist[@]}" "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
