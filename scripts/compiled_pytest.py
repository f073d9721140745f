"""A pytest plugin that runs the tests against the compiled build (scripts/build_compiled.py), as
`coordinator serve --compiled` runs the service: loaded with -p before any test module imports ours.

  PYTHONPATH=$PWD:$PWD/scripts .venv/bin/python -m pytest -p compiled_pytest -q -n 2 tests/unit

The build directory is COORDINATOR_COMPILED's (a path, or 1 for build/compiled). Each process (the controller and
each xdist worker) says at the end how many listed modules it ran compiled, from their `__file__`: on stderr, and
appended to COORDINATOR_COMPILED_REPORT when set (the workers' stderr is not shown). Not in CI yet: 22 tests
still fail against the build, all the tests' own way of observing (docs/performance.md); CI's integration tests run
`coordinator serve` compiled, as setup.sh builds it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from coordinator import compiled

_decision = compiled.install(compiled.directory_asked(os.environ.get(compiled.ENVIRONMENT, "1")))


def pytest_report_header(config: Any) -> str:
    return _decision.summary()


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    names = list(_decision.compiled) + [n for n in _decision.fell_back if n != "*"]
    running = compiled.running_compiled(names)
    line = (f"compiled_pytest pid={os.getpid()} worker={os.environ.get('PYTEST_XDIST_WORKER', '-')} "
            f"running_compiled={sum(running.values())} imported={len(running)} decided_compiled="
            f"{len(_decision.compiled)} of {len(names)}\n")
    sys.stderr.write(line)
    report = os.environ.get("COORDINATOR_COMPILED_REPORT")
    if report:
        with open(report, "a") as out:
            out.write(line)
