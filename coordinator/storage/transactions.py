"""All-or-nothing writes: a transactional confluent-kafka producer with group commit.

An idempotent producer acknowledges records batch by batch, and librdkafka may close a batch at a boundary of
its choosing when other groups' records share it: a commit of many partitions could then be stored in part.
Inside a transaction every record of a write becomes visible together or not at all (the loader reads
read_committed), so a write is atomic whatever the batching.

Group commit keeps the cost per write low: writes queue while one transaction is in flight; the next transaction
takes every queued write (begin, produce them all, commit), so concurrent SyncGroups and OffsetCommits share one
commit round trip instead of paying one each; a write that finds no transaction in flight starts one from send()
itself, and the writes queued behind a commit start theirs in the callback that brings its result, neither waiting
for a turn of a busy loop; with `markers_settle_ms`, either is held on a loop timer until that long after the last
commit's outcome, writes queued meanwhile joining it (transaction_queue.py `_begin_or_hold`: Kafka would refuse its
AddPartitionsToTxn while it writes that commit's markers, and librdkafka waits 20 ms to try again). A write's future
resolves with the transaction's outcome (None: committed; else the error), in the loop callback that brings it. A
failed transaction is aborted, and every write in it fails with the same error: none of them is visible, so the
waiting requests are told so and retry.

Opened ahead: librdkafka (transactions v1) registers a partition with the transaction (AddPartitionsToTxn, a round
trip to Kafka's transaction coordinator) only once a record is produced to it, so a write pays that round trip
before its Produce and EndTxn. When a write is expected (a group's join completed: its leader's assignment comes
next) and the producer is idle, `open_ahead` begins the transaction with a marker record in the partition (a
tombstone of a key every reader skips), and the write's commit has two round trips left. The write is still
answered only once EndTxn is (committed); the marker is committed with it, or alone after OPEN_AHEAD_HOLD_S.

The transactional.id is the fence: a new producer with the same id (`init_transactions`) aborts what an older
one left open and fences it, which is how several instances take a partition over (`PartitionTransactions`:
one id per partition). A fenced producer stays fenced: every later write fails (the store reports
NOT_COORDINATOR), it never takes the id back, and `on_fenced` tells its owner once, before any write fails with the
fence (transaction_queue.py).

Broker outages. A transaction whose commit times out (the broker does not answer) has an unknown outcome and
the producer cannot go on with it; aborting it needs the broker too. So the producer is retired at once (its
destruction runs on a thread of its own) and a fresh one is initialised in the background, retrying for as long
as it takes, independently of any write's deadline: `init_transactions` of the fresh one aborts whatever the
retired one left open (or finds it committed). Writes queued meanwhile wait for it no longer than their own
commit timeout, so every write is answered within offsets.commit.timeout.ms, outage or not.

Threads: the client's calls block (transaction_client.py), so each producer runs them on one daemon thread of
its own, one after the other (serial_thread.py): init, transactions, aborts and the final destroy of a producer
never overlap (closing a producer while a commit runs on another thread makes librdkafka refuse the abort:
"Conflicting commit_transaction API call is already in progress"), and many producers initialise in parallel
instead of queueing for asyncio's small default executor. The event loop never waits on them.

One producer has one transaction in flight at a time; partition_writers.py routes partitions to several.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from coordinator.storage.kafka_logs import librdkafka_logger
from coordinator.storage.producer import KafkaRecord
from coordinator.storage.serial_thread import SerialThread
from coordinator.storage.transaction_client import FENCED_ERRORS, TransactionClient
from coordinator.storage.transaction_queue import Queued, TransactionQueue, settle_writes

log = logging.getLogger("coordinator.storage")
_MIN_TIMEOUT_S = 0.5  # a transaction started late still gets this long
_INIT_ATTEMPT_S = 10.0  # one init_transactions call of a background re-initialisation (then called again)
_INIT_RETRY_S = 0.5
# A transaction opened ahead of a write that is expected (`open_ahead`) is committed on its own after this if no
# write came: meanwhile it holds back its partitions' last stable offset (read_committed readers wait).
OPEN_AHEAD_HOLD_S = 1.0

_Outcome = tuple["KafkaError | None", "str | None"]  # a transaction's error, and what to do next


class TransactionalProducer(TransactionQueue[tuple[list[Queued], "asyncio.Future[_Outcome | KafkaError]"]]):
    """Same surface as AsyncProducer (send, flush, close), every write inside a transaction."""

    def __init__(self, topic: str, settings: dict[str, object], name: str, transactional_id: str,
                 timeout_ms: int, on_fenced: Callable[[], None] | None = None,
                 fatal_is_fence: bool = False, markers_settle_ms: float = 0.0) -> None:
        super().__init__(topic, name, transactional_id, timeout_ms, on_fenced, fatal_is_fence)
        # Any fatal error counts as a fence, not only PRODUCER_FENCED: a partition's producer must never take its
        # id back on its own (a fresh init_transactions would fence the partition's new owner); the owner decides
        # (PartitionTransactions). A single instance's producers re-initialise after a fatal error other than a
        # fence, as before.
        client_settings = {k: v for k, v in settings.items() if k not in ("enable.idempotence", "acks")}
        client_settings.update({"transactional.id": transactional_id,
                                "transaction.timeout.ms": max(timeout_ms * 2, 10_000)})
        client_settings.setdefault("logger", librdkafka_logger(name))  # one line per outage, not one per retry
        self._thread = SerialThread(f"{name}-calls")
        # touched on the serial thread only (its `fenced` also by the loop, between two of its calls)
        self._client = TransactionClient(topic, client_settings, name, transactional_id, fatal_is_fence)
        self._opened_for: set[int] = set()  # partitions of a transaction opened ahead, not committed yet
        # librdkafka retries a refused AddPartitionsToTxn (CONCURRENT_TRANSACTIONS) only after a fixed 20 ms: a
        # transaction begun within this of the last commit is held until then (transaction_queue.py)
        self.markers_settle_s = markers_settle_ms / 1000

    async def start(self, timeout_ms: int = 60_000, *, attempt_ms: int = int(_INIT_ATTEMPT_S * 1000)) -> None:
        """Create the producer and register its transactional.id (fences an older holder of the id and aborts
        its open transaction). A cluster still starting answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS
        for a while (librdkafka retries within a call): calls of `attempt_ms` each, a line after every one that
        did not get there, until `timeout_ms`, then KafkaException."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout_ms / 1000
        while True:
            attempt_s = min(max(deadline - loop.time(), _MIN_TIMEOUT_S), attempt_ms / 1000)
            error = await self._thread.submit(self._client.init, attempt_s)
            if error is None:
                break
            if error.fatal() or error.code() in FENCED_ERRORS or loop.time() >= deadline or self._closed:
                raise KafkaException(error)
            log.info("event=transactions_init_waiting producer=%s transactional_id=%s waited_ms=%d timeout_ms=%d "
                     "error=%s detail=Kafka's transaction coordinator has not given the id a producer id yet "
                     "(a fresh cluster loads __transaction_state first)", self.name, self.transactional_id,
                     (loop.time() - started) * 1000, timeout_ms, error)
            await asyncio.sleep(_INIT_RETRY_S)
        self._ready = True
        self._worker = loop.create_task(self._run(), name=f"{self.name}-transactions")

    def open_ahead(self, partition: int, marker: KafkaRecord) -> None:
        """A write to `partition` is expected soon (a group's assignment, once its leader sends it): while the
        producer is idle, its transaction begins now with `marker` (a record every reader skips) in the
        partition, so registering the partition with the transaction (a round trip to Kafka's transaction
        coordinator) happens before the write, not during it. The next write of any partition commits it; with
        none within OPEN_AHEAD_HOLD_S, it is committed alone. A busy producer is left alone (its next transaction
        takes the write as usual)."""
        loop = asyncio.get_running_loop()
        if partition in self._opened_for or self._committing is not None or self._queue or not self._ready \
                or self._closed or self._fenced is not None or self._hold is not None \
                or self.recently_committed(loop.time()):  # (a registration now would be refused, retried in 20 ms)
            return
        self._opened_for.add(partition)
        self._thread.submit(self._client.open_ahead, [marker],
                            then=functools.partial(self._opened_ahead, partition))
        if self._open_ahead_expiry is None:
            self._open_ahead_expiry = loop.call_later(OPEN_AHEAD_HOLD_S, self._commit_opened_alone)

    def _opened_ahead(self, partition: int, produced: bool | KafkaError) -> None:
        """The marker's outcome (on the loop, before any later call's): one not produced opened nothing, so no
        transaction is committed for it alone (a write's commit since then has cleared it already)."""
        if produced is not True:
            self._opened_for.discard(partition)
            if not self._opened_for:
                self._cancel_open_ahead_expiry()

    def _commit_opened_alone(self) -> None:
        self._open_ahead_expiry = None
        if self._opened_for and self._committing is None and not self._queue:
            self._begin_commit(asyncio.get_running_loop())

    def _begin_commit(self, loop: asyncio.AbstractEventLoop) -> None:
        """One transaction of every queued write, on the serial thread; the writes are answered on the loop as
        it returns (`_answer`), the aftermath (abort, fence, a fresh producer) is the worker's (`_finish_commit`)."""
        batch, self._queue = self._queue, []
        self._in_flight = len(batch)
        self._opened_for.clear()  # this transaction commits what was opened ahead
        self._cancel_open_ahead_expiry()
        first_deadline = min((deadline for _, _, deadline, _ in batch), default=loop.time() + self.timeout_ms / 1000)
        timeout_s = max(first_deadline - loop.time(), _MIN_TIMEOUT_S)
        records = [r for records, _, _, _ in batch for r in records]
        sinks = [offsets for records, _, _, offsets in batch for _ in records]
        done = self._thread.submit(self._client.transaction, records, timeout_s, sinks,
                                   then=functools.partial(self._answer, batch))
        self._committing = (batch, done)

    async def _await_commit(self) -> None:
        assert self._committing is not None
        await self._finish_commit(*self._committing)

    async def _finish_commit(self, batch: list[Queued], done: asyncio.Future[_Outcome | KafkaError]) -> None:
        try:
            _, then = _as_outcome(await done)
            if then == "abort":
                then = await self._thread.submit(self._client.abort)
            if then == "fenced":  # told already if the transaction was (`_answer`); else its abort found the fence
                self._become_fenced(self._client.fenced)
            elif then == "retired":
                self._ready = False
                self._start_reinit()
        finally:
            if self._committing is not None and self._committing[0] is batch:  # not a next one `_answer` began
                self._committing = None
                self._in_flight = 0
            # cancelled (close gave up waiting): the outcome is unknown
            settle_writes(batch, KafkaError(KafkaError._TIMED_OUT, "state producer closed mid-commit"))

    def _answer(self, batch: list[Queued], result: _Outcome | KafkaError) -> None:
        """Every write of the transaction, answered first: nothing of a failed one will ever be visible (an
        abortable failure's abort comes after; a fenced one's fence is told before its writes are settled:
        transaction_queue.py). After a commit, the writes queued meanwhile start the next transaction here (or on
        the hold's timer: `_begin_or_hold`), not a loop turn later in the worker (which then only finishes the
        committed one's bookkeeping); anything else is the worker's."""
        error, then = _as_outcome(result)
        self._settle_transaction(batch, error, then == "fenced")
        if error is None and then is None and self._queue and not self._closed and self._ready \
                and self._fenced is None:
            loop = asyncio.get_running_loop()
            self._expire(loop.time())
            if self._queue:
                # committed: the worker has only its bookkeeping left, and a held transaction must not wait for it
                self._committing = None
                self._in_flight = 0
                self._begin_or_hold(loop)

    async def _reinitialise(self) -> None:
        """A fresh producer, retried for as long as it takes (the broker may be down for minutes); writes
        queued meanwhile fail at their own deadline, they never wait for this."""
        attempts = 0
        while not self._closed:
            attempts += 1
            error = await self._thread.submit(self._client.init, _INIT_ATTEMPT_S)
            if error is None:
                self._ready = True
                log.info("event=transactions_reinitialised producer=%s attempts=%d", self.name, attempts)
                return
            if error.code() in FENCED_ERRORS or (error.fatal() and self.fatal_is_fence):  # never take the id back
                self._client.fenced = KafkaError(KafkaError._FENCED, f"fenced: {error.str()}")
                self._become_fenced(self._client.fenced)
                return
            log.info("event=transactions_init_retry producer=%s attempt=%d error=%s", self.name, attempts, error)
            await asyncio.sleep(_INIT_RETRY_S)

    # -- close -----------------------------------------------------------------------------------------------------
    async def close(self, flush_timeout_ms: int = 5_000) -> None:
        """Finish the queued writes (bounded by `flush_timeout_ms`), then destroy the producer on its own thread,
        after any transaction still running there: never concurrently with a commit."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_timeout_ms / 1000
        self._closed = True
        if self._opened_for and self._committing is None and not self._queue and self._ready:
            self._begin_commit(loop)  # the markers opened ahead, committed (the worker waits for it below)
        self._cancel_open_ahead_expiry()
        self._wake.set()
        if self._worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._worker), flush_timeout_ms / 1000)
            except asyncio.TimeoutError:
                self._worker.cancel()
                await asyncio.gather(self._worker, return_exceptions=True)
        if self._reinit is not None:
            self._reinit.cancel()
            await asyncio.gather(self._reinit, return_exceptions=True)
        if self._hold is not None:  # the worker gave up: nothing begins after this
            self._hold.cancel()
            self._hold = None
        self._fail_queued(KafkaError(KafkaError._DESTROY, "state producer closed"))
        destroyed = self._thread.submit(self._client.destroy)
        self._thread.stop()
        try:
            await asyncio.wait_for(destroyed, max(deadline - loop.time(), _MIN_TIMEOUT_S))
        except asyncio.TimeoutError:  # a commit the broker does not answer: it ends on its own, then the destroy
            log.warning("event=producer_close_pending producer=%s", self.name)



def _as_outcome(result: _Outcome | KafkaError) -> _Outcome:
    """A call that crashed (our bug) returns its error alone: its transaction's state is unknown, so abort."""
    return result if isinstance(result, tuple) else (result, "abort")
