"""One memory budget for every relayed response, shaped like Kafka's producer `BufferPool`.

Kafka bounds its producer with `buffer.memory` (the total), `batch.size` (the poolable size: buffers of exactly
that size are kept on a free list and reused) and `max.block.ms` (how long an allocation may wait). We do the
same for frames read from upstream brokers:
- a frame up to `poolable_bytes` is read into a pooled buffer of exactly that size (reused, no allocator churn);
- a larger frame gets a buffer of exactly its size, counted against the total while it lives;
- when the total is spent, the allocation waits in FIFO order (a large frame cannot be starved by a stream of
  small ones) until enough is released or `max_block_ms` passes, then fails with `BufferExhausted`;
- a frame larger than the whole budget fails at once: waiting could never help.

Single-threaded (one event loop), so no lock: Kafka's `ReentrantLock` + `Condition` per waiter become a deque of
futures. Accounting: `available_bytes` = never-allocated memory + free pooled buffers.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass


class BufferExhausted(Exception):
    """No memory for a frame within the maximum block time (or the frame exceeds the whole budget)."""


@dataclass(frozen=True, slots=True)
class PoolStats:
    total_bytes: int
    available_bytes: int
    free_pooled: int
    waiters: int

    @property
    def used_bytes(self) -> int:
        return self.total_bytes - self.available_bytes


class BufferPool:
    def __init__(self, total_bytes: int, poolable_bytes: int, max_block_ms: int) -> None:
        if poolable_bytes < 1 or total_bytes < poolable_bytes:
            raise ValueError("need 1 <= poolable_bytes <= total_bytes")
        if max_block_ms < 0:
            raise ValueError("max_block_ms must not be negative")
        self.total_bytes = total_bytes
        self.poolable_bytes = poolable_bytes
        self.max_block_ms = max_block_ms
        self._free: list[bytearray] = []  # pooled buffers ready for reuse
        self._unpooled_available = total_bytes  # memory not held by any buffer, pooled or not
        self._waiters: collections.deque[tuple[int, asyncio.Future[bytearray]]] = collections.deque()

    @property
    def available_bytes(self) -> int:
        return self._unpooled_available + len(self._free) * self.poolable_bytes

    def stats(self) -> PoolStats:
        return PoolStats(self.total_bytes, self.available_bytes, len(self._free), len(self._waiters))

    def buffer_size(self, frame_bytes: int) -> int:
        """The size of the buffer a frame of `frame_bytes` gets (what it costs against the budget)."""
        return self.poolable_bytes if frame_bytes <= self.poolable_bytes else frame_bytes

    def try_allocate(self, frame_bytes: int) -> bytearray | None:
        """A buffer for the frame now, or None if it would have to wait (memory short, or others waiting first)."""
        if frame_bytes > self.total_bytes:
            raise BufferExhausted(f"frame of {frame_bytes} bytes exceeds the relay buffer memory "
                                  f"of {self.total_bytes} bytes")
        if self._waiters:
            return None  # FIFO: those already waiting go first
        return self._take(self.buffer_size(frame_bytes))

    async def allocate(self, frame_bytes: int) -> bytearray:
        """A buffer for the frame, waiting FIFO up to max_block_ms; raises BufferExhausted after that."""
        buffer = self.try_allocate(frame_bytes)
        if buffer is not None:
            return buffer
        future: asyncio.Future[bytearray] = asyncio.get_running_loop().create_future()
        entry = (self.buffer_size(frame_bytes), future)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.max_block_ms / 1000)
        except asyncio.TimeoutError:
            if future.done() and not future.cancelled():
                return future.result()  # granted just as the time ran out
            raise BufferExhausted(f"no relay buffer memory for a {frame_bytes}-byte frame within "
                                  f"{self.max_block_ms} ms (available {self.available_bytes} of "
                                  f"{self.total_bytes} bytes)") from None
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.deallocate(future.result())  # granted, but our caller is gone: give it back
            raise
        finally:
            if not future.done():  # timed out or cancelled while queued: leave the queue
                self._waiters.remove(entry)
                future.cancel()
                self._serve_waiters()  # the next waiter may fit now

    def deallocate(self, buffer: bytearray) -> None:
        """Give a buffer back; pooled sizes go on the free list, others back to the budget."""
        if len(buffer) == self.poolable_bytes:
            self._free.append(buffer)
        else:
            self._unpooled_available += len(buffer)
        self._serve_waiters()

    def _take(self, size: int) -> bytearray | None:
        if size == self.poolable_bytes and self._free:
            return self._free.pop()
        if self.available_bytes < size:
            return None
        while self._unpooled_available < size:  # release pooled buffers to make room for an exact-size one
            self._free.pop()
            self._unpooled_available += self.poolable_bytes
        self._unpooled_available -= size
        return bytearray(size)

    def _serve_waiters(self) -> None:
        while self._waiters:
            size, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            buffer = self._take(size)
            if buffer is None:
                return
            self._waiters.popleft()
            future.set_result(buffer)
