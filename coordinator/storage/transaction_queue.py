"""What both state writers share (transactions.py's on librdkafka, native_transactions.py's on our own client): the
writes queued for the next transaction (group commit), each with its deadline, and the worker that starts a
transaction of every queued write once a producer is ready, fails them at their deadline or when fenced, and the
fence, the background re-initialisation's start, flush.

The fence comes first. A write's outcome is an Outcome (outcome.py): whoever waits for it hears in the very call that
settles it. So once a newer holder of the id fenced this producer, the owner is told (`on_fenced`: the ownership
stops serving the partition) before any write fails with the fence, the failed transaction's writes and the ones
queued behind it alike (`_settle_transaction`, `_become_fenced`); and the fence the loop sees (`fenced`, `send`'s
refusal, the partition's `owns`) is set in the same call that tells it.

How a transaction is committed, how a producer is (re-)initialised and how it closes are the writers' own
(`_begin_commit`, `_await_commit`, `_reinitialise`, `close`).

A transaction begun right after the last one committed may be held back (`markers_settle_s`, a writer's own; 0: never):
Kafka's transaction coordinator answers EndTxn before it has written the commit's markers, and until they are written
it refuses the next transaction's AddPartitionsToTxn with CONCURRENT_TRANSACTIONS (~1-2 ms on one broker), which
librdkafka retries only after a fixed 20 ms. Held, the transaction begins on a loop timer `markers_settle_s` after the
last commit's outcome, with every write queued by then (`_begin_or_hold`); nothing else waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from confluent_kafka import KafkaError

from coordinator.storage.outcome import Outcome
from coordinator.storage.producer import KafkaRecord

log = logging.getLogger("coordinator.storage")

NOT_READY_POLL_S = 0.05  # how often queued writes look for a re-initialised producer

# records, outcome, loop deadline, where the acknowledged records' offsets go (if wanted)
Queued = tuple[Sequence[KafkaRecord], "asyncio.Future[KafkaError | None]", float, "list[int] | None"]


def settle_writes(writes: Sequence[Queued], error: KafkaError | None) -> None:
    """Each of these writes not settled yet gets `error` (None: committed)."""
    for _, future, _, _ in writes:
        if not future.done():
            future.set_result(error)

Commit = TypeVar("Commit")  # what a writer keeps of the transaction being committed


class TransactionQueue(Generic[Commit]):
    """Writes queued for the next transaction; one transaction in flight at a time (`_committing`)."""

    def __init__(self, topic: str, name: str, transactional_id: str, timeout_ms: int,
                 on_fenced: Callable[[], None] | None, fatal_is_fence: bool) -> None:
        self.topic = topic
        self.name = name
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.on_fenced = on_fenced  # called on the loop, once, when a newer holder of the id fences this one
        self.fatal_is_fence = fatal_is_fence
        self._ready = False  # an initialised producer is there
        self._queue: list[Queued] = []
        self._in_flight = 0  # writes in the transaction being committed
        self._committing: Commit | None = None
        self._open_ahead_expiry: asyncio.TimerHandle | None = None
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._reinit: asyncio.Task[None] | None = None
        self._closed = False
        # the error every write gets once a newer holder of the id fenced this producer, set as the owner is told
        # (`_become_fenced`); None while not
        self._fenced: KafkaError | None = None
        self.transactions = 0  # committed or aborted, for benchmarks and tests
        self.markers_settle_s = 0.0  # a transaction begins no sooner than this after the last commit's outcome
        self._last_commit_at = float("-inf")  # loop time of the last committed transaction's outcome
        self._hold: asyncio.TimerHandle | None = None  # the held transaction's start

    # -- the writer's own ------------------------------------------------------------------------------------------
    def _begin_commit(self, loop: asyncio.AbstractEventLoop) -> None:
        """One transaction of every queued write (sets `_committing`)."""
        raise NotImplementedError

    async def _await_commit(self) -> None:
        """Until the transaction in `_committing` and its aftermath are done (then `_committing` is None or the
        next one)."""
        raise NotImplementedError

    async def _reinitialise(self) -> None:
        """A fresh producer in the background (sets `_ready`), or fenced for good."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    def send(self, records: Sequence[KafkaRecord], *, offsets: list[int] | None = None
             ) -> asyncio.Future[KafkaError | None]:
        """Queue `records` now for the next transaction (transactions take the queue in order); the future
        resolves with None once it is committed, else with its error (never raises); its `on_settled` listeners
        run in the call that brings the transaction's outcome (outcome.py). `offsets` gets the records' offsets
        as the partitions' leaders acknowledged them."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[KafkaError | None] = Outcome(loop=loop)
        fence = self._fenced
        if self._closed or self._worker is None:
            future.set_result(KafkaError(KafkaError._DESTROY, "state producer closed"))
        elif fence is not None:
            future.set_result(fence)
        elif not records:
            future.set_result(None)
        else:
            self._queue.append((records, future, loop.time() + self.timeout_ms / 1000, offsets))
            if self._committing is None and self._ready and len(self._queue) == 1:
                # Nothing in flight: the transaction starts now, not a loop turn later when the worker runs
                # (a busy loop's turn is every request that arrived meanwhile, a thousand SyncGroups at once).
                self._begin_or_hold(loop)
            self._wake.set()
        return future

    async def _run(self) -> None:
        """The worker: waits out each transaction's aftermath; writes queued while no producer is ready (a
        re-initialisation) fail at their deadline or start once it is ready; a fenced producer fails them."""
        loop = asyncio.get_running_loop()
        while not self._closed or self._queue or self._committing is not None:
            if self._committing is not None:
                await self._await_commit()
                continue
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._expire(loop.time())
            fence = self._fenced
            if fence is not None or (self._closed and not self._ready):
                self._fail_queued(fence or KafkaError(KafkaError._DESTROY, "state producer closed"))
                continue
            if not self._queue:
                continue
            if not self._ready:  # a fresh producer is being initialised: wait for it, within the deadlines
                await asyncio.sleep(NOT_READY_POLL_S)
                continue
            if self._hold is None:
                self._begin_or_hold(loop)
            if self._hold is not None:  # held: its timer begins it (and wakes this worker)
                self._wake.clear()
                await self._wake.wait()

    def _begin_or_hold(self, loop: asyncio.AbstractEventLoop) -> None:
        """`_begin_commit` now, or, within `markers_settle_s` of the last commit's outcome, on a timer at its end
        (the writes queued meanwhile join it); a transaction already held is left to its timer."""
        if self._hold is not None:
            return
        wait_s = self._last_commit_at + self.markers_settle_s - loop.time()
        if wait_s <= 0:
            self._begin_commit(loop)
        else:
            self._hold = loop.call_later(wait_s, self._held_begin)

    def _held_begin(self) -> None:
        """The held transaction begins, with every write queued by now (closing included: close finishes them)."""
        self._hold = None
        loop = asyncio.get_running_loop()
        if self._committing is None and self._queue and self._ready and self._fenced is None:
            self._expire(loop.time())
            if self._queue:
                self._begin_commit(loop)
        self._wake.set()

    def recently_committed(self, now: float) -> bool:
        """Whether the last commit's markers may still be being written (within `markers_settle_s` of its outcome):
        a transaction begun now would be held."""
        return now < self._last_commit_at + self.markers_settle_s

    def _expire(self, now: float) -> None:
        """Writes that waited out their commit timeout (behind a slow transaction, or for a fresh producer)."""
        if not self._queue or self._queue[0][2] > now:  # oldest first: the same timeout for every write
            return
        expired = [item for item in self._queue if item[2] <= now]
        self._queue = [item for item in self._queue if item[2] > now]
        settle_writes(expired, KafkaError(KafkaError._MSG_TIMED_OUT, "not written within the commit timeout"))

    def _fail_queued(self, error: KafkaError) -> None:
        queued, self._queue = self._queue, []
        settle_writes(queued, error)

    def _settle_transaction(self, batch: list[Queued], error: KafkaError | None, fenced: bool) -> None:
        """Every write of a finished transaction settled with its outcome (None: committed); a fenced one's with
        the fence, once it is told."""
        self.transactions += 1
        if error is None and not fenced:
            self._last_commit_at = asyncio.get_running_loop().time()
        if fenced:
            self._become_fenced(error, batch)
            return
        settle_writes(batch, error)

    def _become_fenced(self, error: KafkaError | None, fenced_writes: Sequence[Queued] = ()) -> None:
        """A newer holder of the id fenced this producer, for good: the owner is told first (once), then the
        fenced transaction's writes and the ones queued behind them fail with the fence, in the order sent."""
        self._ready = False
        if self._fenced is None:
            self._fenced = error if error is not None and error.code() == KafkaError._FENCED else \
                KafkaError(KafkaError._FENCED, f"fenced: {error.str() if error is not None else '?'}")
        self._notify_fenced()
        settle_writes(fenced_writes, self._fenced)
        self._fail_queued(self._fenced)

    def _notify_fenced(self) -> None:
        if self.on_fenced is not None:
            callback, self.on_fenced = self.on_fenced, None  # once
            try:
                callback()
            except Exception:
                log.exception("event=on_fenced_failed producer=%s", self.name)

    def _start_reinit(self) -> None:
        running = self._reinit is not None and not self._reinit.done()
        if self._closed or self._fenced is not None or running:
            return
        self._reinit = asyncio.get_running_loop().create_task(self._reinitialise(), name=f"{self.name}-reinit")

    def _cancel_open_ahead_expiry(self) -> None:
        if self._open_ahead_expiry is not None:
            self._open_ahead_expiry.cancel()
            self._open_ahead_expiry = None

    async def flush(self, timeout_ms: int) -> int:
        """Wait until every queued write is committed or failed; returns how many are still waiting."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while (self._queue or self._in_flight) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return len(self._queue) + self._in_flight
