"""`coordinator` (bench/coordinator.py's `start_ours` command line) with cProfile on its main thread, switched on
by SIGUSR1 and off by SIGUSR2 (the statistics then written to the file named by $BENCH_CPROFILE_OUTPUT, in
pstats format): a benchmark profiles one phase of its run, the event loop's thread where the group logic runs.

  BENCH_CPROFILE_OUTPUT=FILE python -m bench.cprofiled --log-level WARNING serve ...

A sampling profiler attached from outside (py-spy) saw only part of the main thread's samples of this server;
cProfile counts every call in the thread that enabled it, here in that thread's CPU time (its own cost, a clock
read per call and return, inflates small calls: read the ranking and the call counts, and take the absolute time
per request from the benchmark's figures)."""

from __future__ import annotations

import cProfile
import os
import signal
import sys
import time
from types import FrameType

from coordinator.cli import main

PROFILE_ON, PROFILE_OFF = signal.SIGUSR1, signal.SIGUSR2
OUTPUT_VARIABLE = "BENCH_CPROFILE_OUTPUT"


def install(output: str) -> None:
    profiler = cProfile.Profile(time.thread_time)  # CPU time: wall time would count the loop's waits and the
    # machine's other load

    def on(_signal: int, _frame: FrameType | None) -> None:
        profiler.enable()

    def off(_signal: int, _frame: FrameType | None) -> None:
        profiler.disable()
        profiler.dump_stats(output)

    signal.signal(PROFILE_ON, on)
    signal.signal(PROFILE_OFF, off)


if __name__ == "__main__":
    install(os.environ[OUTPUT_VARIABLE])
    sys.exit(main())
