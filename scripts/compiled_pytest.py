"""A pytest plugin that runs the tests against the compiled build (scripts/build_compiled.py), as
`coordinator serve` runs the service by default: loaded with -p before any test module imports ours.

  PYTHONPATH=$PWD:$PWD/scripts .venv/bin/python -m pytest -p compiled_pytest -q -n 2 tests/unit

The build directory is COORDINATOR_COMPILED's (a path, or 1 for build/compiled). Each process (the controller and
each xdist worker) says at the end how many of the build's modules it ran compiled, from their `__file__`, on
stderr (the workers' stderr is not shown) and as one JSON line appended to COORDINATOR_COMPILED_REPORT (a file of
the run's own when unset). The run then **fails**, whatever the tests said, when a process that ran tests (each
worker; the one process without xdist) had a module of the build fall back to its source or imported one from a
source anyway: a build that no longer matches the sources falls back module by module (coordinator/compiled.py), and
the run would test the pure tree while claiming the build. With COMPILED_PYTEST_EVERY_MODULE=1 (scripts/test.sh's
whole unit suite) each such process must also have run every module of the build compiled (55 of 55: each worker
imports them all). The terminal summary says what each process ran.

Tests marked `pure_only(reason)` are deselected here and counted in that summary, each with its reason: tests of
what only the pure tree has (simulator/plants.py's planted bugs replace a production function or method, which
compiled callers never look up again). scripts/test.sh runs this after the pure run (CI, README "Tests").
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

from coordinator import compiled

_decision = compiled.install(compiled.directory_asked(os.environ.get(compiled.ENVIRONMENT, "1")))
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
REPORT = "COORDINATOR_COMPILED_REPORT"
EVERY_MODULE = "COMPILED_PYTEST_EVERY_MODULE"  # 1: each process that ran tests must have run every module compiled
_RUN = "COMPILED_PYTEST_RUN"  # the controller's pid: this run's lines in a report file several runs append to
_OWN_FILE = False  # the report file was made here: removed once read
if _WORKER is None:  # the controller (or the one process): its workers inherit both
    os.environ[_RUN] = str(os.getpid())
    _OWN_FILE = not os.environ.get(REPORT)
    if _OWN_FILE:
        descriptor, os.environ[REPORT] = tempfile.mkstemp(prefix="compiled_pytest-", suffix=".jsonl")
        os.close(descriptor)
_pure_only: list[tuple[str, str]] = []  # (node id, reason) of the tests deselected here


def built() -> int:
    """How many modules the build holds (every one the loader decided on: compiled or fallen back)."""
    return len(_decision.compiled) + len([name for name in _decision.fell_back if name != "*"])


def pytest_report_header(config: Any) -> str:
    return _decision.summary()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    kept, deselected = [], []
    for item in items:
        marker = item.get_closest_marker("pure_only")
        if marker is None:
            kept.append(item)
        else:
            deselected.append(item)
            _pure_only.append((item.nodeid, str(marker.args[0] if marker.args else marker.kwargs.get("reason", "?"))))
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def _own_report() -> dict[str, Any]:
    names = list(_decision.compiled) + [n for n in _decision.fell_back if n != "*"]
    running = compiled.running_compiled(names)
    return {"run": os.environ.get(_RUN), "pid": os.getpid(), "worker": _WORKER or "-", "running_compiled": sum(running.values()),
            "imported": len(running), "decided_compiled": len(_decision.compiled), "built": built(),
            "fell_back": sorted(n for n in _decision.fell_back if n != "*")[:5],
            "no_build": _decision.fell_back.get("*"), "pure_only": _pure_only}


def _short(report: dict[str, Any], every_module: bool) -> bool:
    """A process that ran tests fell short of the build: nothing built, a module fallen back to its source, one
    imported from a source anyway; with `every_module`, also one of the build's modules it never imported."""
    return (report["built"] == 0 or report["decided_compiled"] < report["built"]
            or report["running_compiled"] < report["imported"]
            or (every_module and report["running_compiled"] < report["built"]))


def _verdict(reports: list[dict[str, Any]], every_module: bool) -> tuple[bool, list[str]]:
    """Whether every process that ran tests ran the build compiled, and the summary's lines."""
    workers = [r for r in reports if r["worker"] != "-"]
    ran_tests = workers or [r for r in reports if r["worker"] == "-"]
    lines = [f"{r['worker']}: running_compiled={r['running_compiled']} imported={r['imported']} "
             f"decided_compiled={r['decided_compiled']} of {r['built']} built" for r in reports]
    short = next((r for r in ran_tests if _short(r, every_module)), None)
    ok = bool(ran_tests) and short is None
    if not ok:
        why = ("no process reported" if short is None else short["no_build"] or
               f"{short['worker']} ran {short['running_compiled']} of {short['built']} compiled, imported "
               f"{short['imported']} (" + (f"fell back, first: {', '.join(short['fell_back'])}" if short["fell_back"]
                                           else "none fell back: some were never imported") + ")")
        lines.append(f"FAILED: not the whole build ran compiled ({why}); rebuild: "
                     "PYTHONPATH=$PWD .venv/bin/python scripts/build_compiled.py")
    pure_only = {nodeid: reason for r in ran_tests for nodeid, reason in r["pure_only"]}
    lines.append(f"{len(pure_only)} pure-only tests deselected (marked pure_only; they run in the pure run)")
    lines += [f"  {nodeid}: {reason}" for nodeid, reason in sorted(pure_only.items())]
    return ok, lines


_summary: list[str] = []


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    own = _own_report()
    sys.stderr.write(f"compiled_pytest pid={own['pid']} worker={own['worker']} running_compiled="
                     f"{own['running_compiled']} imported={own['imported']} decided_compiled="
                     f"{own['decided_compiled']} of {own['built']} pure_only_deselected={len(_pure_only)}\n")
    with open(os.environ[REPORT], "a") as out:
        out.write(json.dumps(own) + "\n")
    if _WORKER is not None:
        return
    with open(os.environ[REPORT]) as lines:  # the workers wrote theirs before they finished
        reports = [report for report in map(json.loads, filter(str.strip, lines)) if report.get("run") == own["run"]]
    if _OWN_FILE:
        os.unlink(os.environ[REPORT])
    ok, _summary[:] = _verdict(reports, os.environ.get(EVERY_MODULE, "") == "1")
    if not ok and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _summary:
        terminalreporter.section("compiled build (scripts/compiled_pytest.py)")
        for line in _summary:
            terminalreporter.write_line(line)
