"""The relay's BufferPool keeps Kafka's BufferPool rules: pooled buffers reused, larger ones exact and counted,
FIFO waiters, a bounded wait, and a frame larger than the budget refused at once."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.relay.buffer_pool import BufferExhausted, BufferPool


def test_small_frames_reuse_pooled_buffers() -> None:
    pool = BufferPool(total_bytes=64, poolable_bytes=16, max_block_ms=0)
    first = pool.try_allocate(10)
    assert first is not None and len(first) == 16 and pool.available_bytes == 48
    pool.deallocate(first)
    assert pool.try_allocate(3) is first  # the same buffer back from the free list
    assert pool.available_bytes == 48


def test_large_frames_are_exact_and_counted_against_the_total() -> None:
    pool = BufferPool(total_bytes=100, poolable_bytes=16, max_block_ms=0)
    pooled = pool.try_allocate(16)
    assert pooled is not None
    pool.deallocate(pooled)  # now on the free list
    large = pool.try_allocate(90)
    assert large is not None and len(large) == 90  # the free pooled buffer was given up to make room
    assert pool.available_bytes == 10 and pool.stats().free_pooled == 0
    assert pool.try_allocate(16) is None
    pool.deallocate(large)
    assert pool.available_bytes == 100


def test_a_frame_larger_than_the_budget_fails_at_once() -> None:
    pool = BufferPool(total_bytes=100, poolable_bytes=16, max_block_ms=60_000)
    with pytest.raises(BufferExhausted, match="exceeds"):
        pool.try_allocate(101)


async def test_waiters_are_served_in_fifo_order_and_newcomers_queue_behind_them() -> None:
    pool = BufferPool(total_bytes=64, poolable_bytes=16, max_block_ms=5_000)
    held = pool.try_allocate(64)
    assert held is not None
    order: list[str] = []

    async def take(name: str, size: int) -> bytearray:
        buffer = await pool.allocate(size)
        order.append(name)
        return buffer

    big = asyncio.create_task(take("big", 48))
    await asyncio.sleep(0)
    small = asyncio.create_task(take("small", 8))
    await asyncio.sleep(0)
    assert pool.stats().waiters == 2
    assert pool.try_allocate(8) is None  # not ahead of those waiting
    pool.deallocate(held)
    got_big, got_small = await asyncio.gather(big, small)
    assert order == ["big", "small"] and len(got_big) == 48 and len(got_small) == 16
    assert pool.available_bytes == 0


async def test_a_wait_longer_than_max_block_fails_and_leaves_the_queue() -> None:
    pool = BufferPool(total_bytes=32, poolable_bytes=16, max_block_ms=50)
    held = pool.try_allocate(32)
    with pytest.raises(BufferExhausted, match="within 50 ms"):
        await pool.allocate(16)
    assert pool.stats().waiters == 0
    pool.deallocate(held)  # type: ignore[arg-type]
    assert pool.available_bytes == 32


async def test_a_cancelled_waiter_gives_back_what_it_was_granted() -> None:
    pool = BufferPool(total_bytes=32, poolable_bytes=16, max_block_ms=5_000)
    held = pool.try_allocate(32)
    waiter = asyncio.create_task(pool.allocate(20))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    pool.deallocate(held)  # type: ignore[arg-type]
    assert pool.available_bytes == 32 and pool.stats().waiters == 0
