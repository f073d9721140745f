"""The serial thread of a transactional producer (coordinator/storage/serial_thread.py): calls run one after
another off the loop, and a call's `then` runs on the loop as its result arrives, before the future's own
callbacks, so the writes of a committed transaction are answered a loop turn sooner."""

from __future__ import annotations

import asyncio
import threading

from coordinator.storage.serial_thread import SerialThread


async def test_calls_run_in_order_on_one_thread_off_the_loop() -> None:
    thread = SerialThread("test-calls")
    seen: list[tuple[int, str]] = []

    def call(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i

    try:
        results = await asyncio.wait_for(asyncio.gather(*(thread.submit(call, i) for i in range(5))), 10)
    finally:
        thread.stop()
    assert results == [0, 1, 2, 3, 4]
    assert seen == [(i, "test-calls") for i in range(5)]


async def test_then_runs_with_the_result_before_the_futures_callbacks() -> None:
    thread = SerialThread("test-then")
    order: list[str] = []
    try:
        future = thread.submit(lambda: "done", then=lambda result: order.append(f"then:{result}"))
        future.add_done_callback(lambda f: order.append(f"callback:{f.result()}"))
        assert await asyncio.wait_for(future, 10) == "done"
        await asyncio.sleep(0)  # the done callback's turn
    finally:
        thread.stop()
    assert order == ["then:done", "callback:done"]


async def test_a_failing_then_still_settles_the_future() -> None:
    thread = SerialThread("test-then-fails")
    try:
        def failing(_result: object) -> None:
            raise ZeroDivisionError

        future = thread.submit(lambda: 7, then=failing)
        assert await asyncio.wait_for(future, 10) == 7
    finally:
        thread.stop()
