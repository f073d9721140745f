"""Waiting for a condition in tests: polled, bounded, and failing with what did not happen (never a fixed sleep)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll `condition` (a function, or a coroutine function) until it returns something truthy, and return that;
    fail saying what did not happen within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)
