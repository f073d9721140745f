#!/usr/bin/env bash
# The test command: sets up the machine, type-checks the tree, then runs every test (unit, integration against a
# real Apache Kafka broker, interop with real clients), then the unit suite against the compiled build (below).
# Extra arguments go to pytest (and leave the compiled run out).
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
# Then the unit suite again against the compiled build that `coordinator serve` runs by default (setup.sh builds it;
# scripts/compiled_pytest.py): ~3-4 minutes on CI's 2 cores. It fails when the build is missing or no longer matches
# the tree (setup.sh leaves a build stale under uncommitted edits: python scripts/build_compiled.py rebuilds), and
# when a worker ran fewer modules compiled than the build holds. COORDINATOR_COMPILED=0 runs the pure suite only;
# a build elsewhere: COORDINATOR_COMPILED=DIR. With arguments (a selection of tests) it is not run.
compiled=${COORDINATOR_COMPILED:-1}
case "${compiled,,}" in
  0|false|no|pure)
    echo "test.sh: COORDINATOR_COMPILED=$compiled: pure only, the unit suite did NOT run against the compiled build" >&2
    ;;
  *)
    if [ $# -gt 0 ]; then
      echo "test.sh: arguments given: the unit suite against the compiled build was not run (no arguments: it is)" >&2
    else
      case "${compiled,,}" in 1|true|yes|default) where=();; *) where=("$compiled");; esac
      if ! verdict=$(.venv/bin/python -m coordinator.compiled "${where[@]}"); then
        echo "test.sh: FAILED: no usable compiled build, the unit suite cannot run against it (setup.sh's build:" \
             "build/compiled-build.log; rebuild: python scripts/build_compiled.py; COORDINATOR_COMPILED=0 for pure" \
             "only). The loader says: ${verdict:0:600}" >&2
        exit 1
      fi
      started=$SECONDS
      COMPILED_PYTEST_EVERY_MODULE=1 PYTHONPATH="$PWD:$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" \
        .venv/bin/python -m pytest -p compiled_pytest -q "${xdist[@]}" tests/unit
      compiled_status=$?
      echo "test.sh: the unit suite against the compiled build took $((SECONDS - started)) s" \
           "(exit status $compiled_status)" >&2
      if [ "$status" -eq 0 ] && [ "$compiled_status" -ne 0 ]; then
        status=$compiled_status
      fi
    fi
    ;;
esac
exit "$status"
