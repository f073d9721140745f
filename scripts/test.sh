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
# Two pytest-xdist workers by default (CI's machine has 2 cores; the suite is mostly waiting on brokers and clients),
# each with its own session broker, each handed whole test modules (tests/conftest.py, xdist_unit) in collection order
# (--no-loadscope-reorder: Spark's tests last, as tests/analytics/conftest.py orders them). PYTEST_WORKERS=N for
# another count, 0 for one process (what a debugger or `-x` wants).
xdist=()
if [ "${PYTEST_WORKERS:-2}" != 0 ]; then
  xdist=(-n "${PYTEST_WORKERS:-2}" --no-loadscope-reorder)
fi
.venv/bin/python -m pytest "${xdist[@]}" "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
