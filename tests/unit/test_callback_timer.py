"""The per-callback CPU figure of runtime_health: the callback that burns CPU is the one named, not the one that
waits (a loaded machine stretches wall time, not CPU time), and the service's summary line carries it."""
from __future__ import annotations

import asyncio
import functools
import logging
import time

import pytest

from coordinator.runtime_health import CallbackTimer, RuntimeHealth

BURN_S = 0.03


def burn_cpu() -> None:
    started = time.thread_time()
    while time.thread_time() - started < BURN_S:
        pass


def wait_without_cpu() -> None:
    time.sleep(0.1)  # three times the burner's wall time, almost no CPU


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_the_longest_callback_is_measured_in_cpu_time_and_named() -> None:
    loop = asyncio.get_running_loop()
    timer = CallbackTimer(log_above_ms=float("inf"))
    assert timer.install(loop)
    try:
        loop.call_soon(wait_without_cpu)
        loop.call_soon(burn_cpu)
        await _settle()
    finally:
        timer.uninstall()
    assert timer.longest == "burn_cpu"
    assert BURN_S <= timer.longest_s < 0.09  # not the sleeper's 0.1 s of wall time
    assert timer.take_window_max() == (timer.longest_s, "burn_cpu")
    assert timer.take_window_max() == (0.0, "")


async def test_uninstall_stops_timing() -> None:
    loop = asyncio.get_running_loop()
    timer = CallbackTimer()
    assert timer.install(loop)
    timer.uninstall()
    loop.call_soon(burn_cpu)
    await _settle()
    assert timer.longest_s == 0.0 and timer.longest == ""


async def test_a_task_step_is_named_by_its_coroutine() -> None:
    async def slow_step() -> None:
        burn_cpu()

    timer = CallbackTimer(log_above_ms=float("inf"))
    assert timer.install()
    try:
        await asyncio.get_running_loop().create_task(slow_step())
    finally:
        timer.uninstall()
    assert timer.longest.startswith("task:") and "slow_step" in timer.longest


async def test_a_partial_is_named_by_its_function() -> None:
    loop = asyncio.get_running_loop()
    timer = CallbackTimer(log_above_ms=float("inf"))
    assert timer.install(loop)
    try:
        loop.call_soon(functools.partial(functools.partial(burn_cpu)))
        await _settle()
    finally:
        timer.uninstall()
    assert timer.longest == "burn_cpu"


def test_uvloop_is_declined() -> None:
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        assert CallbackTimer().install(loop) is False
    finally:
        loop.close()


async def test_the_summary_line_names_the_longest_callback(caplog: pytest.LogCaptureFixture) -> None:
    health = RuntimeHealth.from_env({"COORDINATOR_TIME_CALLBACKS": "1", "COORDINATOR_HEALTH_LOG_INTERVAL_S": "0.05",
                                     "COORDINATOR_GC_FREEZE_EVERY": "0"})
    caplog.set_level(logging.INFO, logger="coordinator.runtime")
    untimed = asyncio.Handle._run
    health.start()
    try:
        asyncio.get_running_loop().call_soon(burn_cpu)
        deadline = time.monotonic() + 10
        while not any("window_callback=burn_cpu" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            await asyncio.sleep(0.02)
        assert health.snapshot()["callback_max_ms"] >= BURN_S * 1000
    finally:
        await health.stop()
    assert asyncio.Handle._run is untimed
