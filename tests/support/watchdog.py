"""A deadline for every phase of every test, so one hang fails one test instead of the whole run.

A test that hangs (a future no one resolves, a thread join that never returns) would otherwise hold the run until
CI's own limit kills it with nothing said of where. Each phase (setup, call, teardown) gets SIGALRM after its limit;
the handler writes the stacks of the asyncio tasks of the loop the main thread is running and of every other thread,
then fails the phase, and the run goes on with the next test.

Limits: TEST_PHASE_TIMEOUT_S (default 300 s) for a call and a teardown; setup gets three times that, since a test's
setup may build what the session shares (the broker, Jaeger, Spark, Java jars) on a cold machine. A test that needs
longer says so with `@pytest.mark.timeout(seconds)` (applies to its call). 0 turns the watchdog off.
"""

from __future__ import annotations

import asyncio
import io
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

DEFAULT_PHASE_S = 300.0
SETUP_FACTOR = 3
REPEAT_S = 10.0


class PhaseTimeout(Exception):
    """A test phase outlived its limit (the stacks at that moment precede it on stderr)."""


def phase_limit(item: pytest.Item, phase: str, default_s: float) -> float:
    if default_s <= 0:
        return 0.0
    marker = item.get_closest_marker("timeout")
    call_s = float(marker.args[0]) if marker is not None and marker.args else default_s
    if phase == "setup":
        return max(call_s, default_s * SETUP_FACTOR)
    return call_s if phase == "call" else max(call_s, default_s)


def stacks_now() -> str:
    """The stacks of the running loop's tasks (main thread) and of every other thread, as text."""
    out = io.StringIO()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        for task in asyncio.all_tasks(loop):
            out.write(f"--- asyncio task {task.get_name()} ({task.get_coro()!r})\n")
            task.print_stack(limit=20, file=out)
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        out.write(f"--- thread {names.get(ident, '?')} ({ident})\n")
        out.write("".join(traceback.format_stack(frame, limit=20)))
    return out.getvalue()


@contextmanager
def deadline(item: pytest.Item, phase: str, limit_s: float) -> Iterator[None]:
    """SIGALRM after `limit_s` while the block runs (main thread only; elsewhere, or 0: no deadline)."""
    if limit_s <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    fired = False

    def expired(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired:  # raised again every REPEAT_S: the first may have landed in a loop callback, which logs it
            raise PhaseTimeout(f"{phase} of {item.nodeid} still running after its {limit_s:.0f} s")
        fired = True
        sys.stderr.write(f"\n+++ {item.nodeid}: {phase} still running after {limit_s:.0f} s; stacks:\n")
        sys.stderr.write(stacks_now())
        sys.stderr.flush()
        raise PhaseTimeout(f"{phase} of {item.nodeid} still running after {limit_s:.0f} s (stacks on stderr)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit_s, REPEAT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
