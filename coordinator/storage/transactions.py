"""All-or-nothing writes: a transactional confluent-kafka producer with group commit.

An idempotent producer acknowledges records batch by batch, and librdkafka may close a batch at a boundary of
its choosing when other groups' records share it: a commit of many partitions could then be stored in part.
Inside a transaction every record of a write becomes visible together or not at all (the loader reads
read_committed), so a write is atomic whatever the batching.

Group commit keeps the cost per write low: writes queue while one transaction is in flight; the next
transaction takes every queued write (begin, produce them all, commit), so concurrent SyncGroups and
OffsetCommits share one commit round trip instead of paying one each. A write's future resolves with the
transaction's outcome (None: committed; else the error). A failed transaction is aborted, and every write in it
fails with the same error: none of them is visible, so the waiting requests are told so and retry.

The transactional.id is the fence: a new producer with the same id (`init_transactions`) aborts what an older
one left open and fences it, which is how several instances take a partition over (`PartitionTransactions`:
one id per partition). A fenced producer stays fenced: every later write fails (the store reports
NOT_COORDINATOR), it never takes the id back, and `on_fenced` tells its owner once.

Broker outages. A transaction whose commit times out (the broker does not answer) has an unknown outcome and
the producer cannot go on with it; aborting it needs the broker too. So the producer is retired at once (its
destruction runs on a thread of its own) and a fresh one is initialised in the background, retrying for as long
as it takes, independently of any write's deadline: `init_transactions` of the fresh one aborts whatever the
retired one left open (or finds it committed). Writes queued meanwhile wait for it no longer than their own
commit timeout, so every write is answered within offsets.commit.timeout.ms, outage or not.

Threads: the client's calls block, so each producer runs them on one daemon thread of its own, one after the
other (`_SerialThread`): init, transactions, aborts and the final destroy of a producer never overlap (closing
a producer while a commit runs on another thread makes librdkafka refuse the abort: "Conflicting
commit_transaction API call is already in progress"), and many producers initialise in parallel instead of
queueing for asyncio's small default executor. The event loop never waits on them.

One producer has one transaction in flight at a time; partition_writers.py routes partitions to several.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from coordinator.storage.kafka_logs import kafka_reachable, librdkafka_logger
from coordinator.storage.producer import KafkaRecord

log = logging.getLogger("coordinator.storage")
_MIN_TIMEOUT_S = 0.5  # a transaction started late still gets this long
_ABORT_TIMEOUT_S = 0.5  # an abort the broker does not answer this fast: the producer is retired instead
_INIT_ATTEMPT_S = 10.0  # one init_transactions call of a background re-initialisation (then called again)
_INIT_RETRY_S = 0.5
_NOT_READY_POLL_S = 0.05  # how often queued writes look for a re-initialised producer

# A newer producer holds our transactional.id: we must not write again.
FENCED_ERRORS = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
# A message that failed inside a transaction makes the commit fail with _INCONSISTENT ("n message(s) failed
# delivery"); the message's own error (e.g. _MSG_TIMED_OUT) is what the request is answered with.
_DELIVERY_SUMMARY = KafkaError._INCONSISTENT
# The broker did not answer: an abort now could only be local, which leaves the producer's sequence numbers
# behind (the next transaction fails OUT_OF_ORDER_SEQUENCE_NUMBER); a fresh producer gets a new epoch instead.
_UNANSWERED = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE,
                         KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})


class _SerialThread:
    """Blocking calls run one after another on one daemon thread; each returns an asyncio future. The calls
    return values (errors included), they do not raise: a traceback would hold the frames that hold a client."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._calls.put((loop, future, call, args))
        return future

    def stop(self) -> None:
        """The thread ends after the calls already submitted."""
        if self._thread is not None:
            self._calls.put(None)

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            loop, future, call, args = item
            try:
                result = call(*args)
            except Exception as exc:  # our bug: reported on the loop, the thread goes on
                result = KafkaError(KafkaError._FAIL, f"{call.__name__} failed: {exc!r}")
                log.exception("event=producer_call_crashed thread=%s call=%s", self._name, call.__name__)
            try:
                loop.call_soon_threadsafe(_settle, future, result)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


class _DeliveryErrors:
    """The first per-message error of a transaction (delivery reports, served while it commits)."""

    __slots__ = ("first",)

    def __init__(self) -> None:
        self.first: KafkaError | None = None

    def on_delivery(self, error: KafkaError | None, _message: object) -> None:
        if error is not None and self.first is None:
            self.first = error


_Queued = tuple[Sequence[KafkaRecord], "asyncio.Future[KafkaError | None]", float]  # records, outcome, loop deadline


class TransactionalProducer:
    """Same surface as AsyncProducer (send, flush, close), every write inside a transaction."""

    def __init__(self, topic: str, settings: dict[str, object], name: str, transactional_id: str,
                 timeout_ms: int, on_fenced: Callable[[], None] | None = None,
                 fatal_is_fence: bool = False) -> None:
        self.topic = topic
        self.name = name
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.on_fenced = on_fenced  # called on the loop, once, when a newer holder of the id fences this one
        # Any fatal error counts as a fence, not only PRODUCER_FENCED: a partition's producer must never take its
        # id back on its own (a fresh init_transactions would fence the partition's new owner); the owner decides
        # (PartitionTransactions). A single instance's producers re-initialise after a fatal error other than a
        # fence, as before.
        self.fatal_is_fence = fatal_is_fence
        self._settings = {k: v for k, v in settings.items() if k not in ("enable.idempotence", "acks")}
        self._settings.update({"transactional.id": transactional_id,
                               "transaction.timeout.ms": max(timeout_ms * 2, 10_000)})
        self._settings.setdefault("logger", librdkafka_logger(name))  # one line per outage, not one per retry
        self._thread = _SerialThread(f"{name}-calls")
        self._producer: Producer | None = None  # touched on the serial thread only
        self._initialised = False  # its init_transactions returned (serial thread only)
        self._ready = False  # an initialised producer is there (loop side)
        self._queue: list[_Queued] = []
        self._in_flight = 0  # writes in the transaction being committed
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._reinit: asyncio.Task[None] | None = None
        self._closed = False
        self._fenced: KafkaError | None = None
        self.transactions = 0  # committed or aborted, for benchmarks and tests

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    async def start(self, timeout_ms: int = 60_000) -> None:
        """Create the producer and register its transactional.id (fences an older holder of the id and aborts
        its open transaction). A cluster still starting answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS
        for a while: retried until `timeout_ms`, then KafkaException."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            error = await self._thread.submit(self._init_blocking, max(deadline - loop.time(), _MIN_TIMEOUT_S))
            if error is None:
                break
            if error.fatal() or error.code() in FENCED_ERRORS or loop.time() >= deadline or self._closed:
                raise KafkaException(error)
            log.info("event=transactions_init_retry producer=%s error=%s", self.name, error)
            await asyncio.sleep(_INIT_RETRY_S)
        self._ready = True
        self._worker = loop.create_task(self._run(), name=f"{self.name}-transactions")

    def send(self, records: Sequence[KafkaRecord]) -> asyncio.Future[KafkaError | None]:
        """Queue `records` now for the next transaction (transactions take the queue in order); the future
        resolves with None once it is committed, else with its error (never raises)."""
        return self._enqueue(records)

    def _enqueue(self, records: Sequence[KafkaRecord]) -> asyncio.Future[KafkaError | None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[KafkaError | None] = loop.create_future()
        if self._closed or self._worker is None:
            future.set_result(KafkaError(KafkaError._DESTROY, "state producer closed"))
        elif self._fenced is not None:
            future.set_result(self._fenced)
        elif not records:
            future.set_result(None)
        else:
            self._queue.append((records, future, loop.time() + self.timeout_ms / 1000))
            self._wake.set()
        return future

    # -- the transaction loop (event loop side) ---------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed or self._queue:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._expire(loop.time())
            if self._fenced is not None or (self._closed and not self._ready):
                self._fail_queued(self._fenced or KafkaError(KafkaError._DESTROY, "state producer closed"))
                continue
            if not self._queue:
                continue
            if not self._ready:  # a fresh producer is being initialised: wait for it, within the deadlines
                await asyncio.sleep(_NOT_READY_POLL_S)
                continue
            batch, self._queue = self._queue, []
            self._in_flight = len(batch)
            try:
                await self._commit(batch, loop)
            finally:
                self._in_flight = 0
                for _, future, _ in batch:  # cancelled (close gave up waiting): the outcome is unknown
                    if not future.done():
                        future.set_result(KafkaError(KafkaError._TIMED_OUT, "state producer closed mid-commit"))

    async def _commit(self, batch: list[_Queued], loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        timeout_s = max(min(deadline for _, _, deadline in batch) - now, _MIN_TIMEOUT_S)
        records = [r for records, _, _ in batch for r in records]
        error, then = await self._thread.submit(self._transaction, records, timeout_s)
        self.transactions += 1
        for _, future, _ in batch:  # answered first: nothing of a failed transaction will ever be visible
            if not future.done():
                future.set_result(error)
        if then == "abort":
            then = await self._thread.submit(self._abort_blocking)
        if then == "fenced":
            self._ready = False
            self._notify_fenced()
        elif then == "retired":
            self._ready = False
            self._start_reinit()

    def _expire(self, now: float) -> None:
        """Writes that waited out their commit timeout (behind a slow transaction, or for a fresh producer)."""
        if self._queue[0][2] > now:  # oldest first: the same timeout for every write
            return
        expired = [item for item in self._queue if item[2] <= now]
        self._queue = [item for item in self._queue if item[2] > now]
        for _, future, _ in expired:
            if not future.done():
                future.set_result(KafkaError(KafkaError._MSG_TIMED_OUT, "not written within the commit timeout"))

    def _fail_queued(self, error: KafkaError) -> None:
        queued, self._queue = self._queue, []
        for _, future, _ in queued:
            if not future.done():
                future.set_result(error)

    def _notify_fenced(self) -> None:
        if self.on_fenced is not None:
            callback, self.on_fenced = self.on_fenced, None  # once
            try:
                callback()
            except Exception:
                log.exception("event=on_fenced_failed producer=%s", self.name)

    def _start_reinit(self) -> None:
        if self._closed or self._fenced is not None or (self._reinit is not None and not self._reinit.done()):
            return
        self._reinit = asyncio.get_running_loop().create_task(self._reinitialise(), name=f"{self.name}-reinit")

    async def _reinitialise(self) -> None:
        """A fresh producer, retried for as long as it takes (the broker may be down for minutes); writes
        queued meanwhile fail at their own deadline, they never wait for this."""
        attempts = 0
        while not self._closed:
            attempts += 1
            error = await self._thread.submit(self._init_blocking, _INIT_ATTEMPT_S)
            if error is None:
                self._ready = True
                log.info("event=transactions_reinitialised producer=%s attempts=%d", self.name, attempts)
                return
            if error.code() in FENCED_ERRORS or (error.fatal() and self.fatal_is_fence):  # never take the id back
                self._fenced = KafkaError(KafkaError._FENCED, f"fenced: {error.str()}")
                self._notify_fenced()
                return
            log.info("event=transactions_init_retry producer=%s attempt=%d error=%s", self.name, attempts, error)
            await asyncio.sleep(_INIT_RETRY_S)

    # -- blocking calls (the producer's serial thread) ---------------------------------------------------------
    def _init_blocking(self, timeout_s: float) -> KafkaError | None:
        """init_transactions on the current producer, or a new one. A timed-out call is resumed by the next
        (librdkafka allows it); a producer that failed otherwise is retired and the next call starts afresh."""
        if self._producer is None:
            self._producer = Producer(self._settings)
            self._initialised = False
        try:
            self._producer.init_transactions(timeout_s)
            self._initialised = True
            return None
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
        if error.fatal() or not error.retriable():
            self._retire_blocking()
        return error

    def _transaction(self, records: list[KafkaRecord], timeout_s: float) -> tuple[KafkaError | None, str | None]:
        """One transaction with every record, committed within `timeout_s` or not at all. Returns (error, what
        to do next: None, "abort", "retired" or "fenced")."""
        if self._fenced is not None:
            return self._fenced, None
        if self._producer is None:
            return KafkaError(KafkaError._STATE, "no initialised producer"), "retired"
        deliveries = _DeliveryErrors()
        # no local reference to the producer: a retired one must be destroyed by its retiring thread alone
        try:
            self._producer.begin_transaction()
            for partition, key, value in records:
                self._producer.produce(self.topic, value=value, key=key, partition=partition,
                                       on_delivery=deliveries.on_delivery)
            self._producer.commit_transaction(timeout_s)
            kafka_reachable()  # ends an outage's suppressed connection errors with their count
            return None, None
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
        except BufferError:
            error = KafkaError(KafkaError._QUEUE_FULL, "producer queue full")
            return self._failed(error, True)
        if error.code() == KafkaError._FATAL:  # produce() after a fatal error in the background (a fence seen
            error = self._fatal_cause(error)   # by an earlier record's AddPartitionsToTxn): the cause is poll()'s
        elif error.code() == _DELIVERY_SUMMARY:
            self._poll_blocking()  # delivery reports not served yet
            if deliveries.first is not None:
                error = KafkaError(deliveries.first.code(), deliveries.first.str(), fatal=error.fatal(),
                                   txn_requires_abort=error.txn_requires_abort())
        return self._failed(error, error.txn_requires_abort())

    def _fatal_cause(self, refused: KafkaError) -> KafkaError:
        """The producer refuses calls with _FATAL (not itself flagged fatal) once it has hit a fatal error; poll()
        raises that error: a fence (PRODUCER_FENCED / _FENCED) or another fatal one. Either way fatal."""
        cause = self._poll_blocking()
        if cause is not None and cause.fatal():
            return cause
        return KafkaError(KafkaError._FATAL, refused.str(), fatal=True)

    def _poll_blocking(self) -> KafkaError | None:
        """Serve callbacks; a fatal error of the producer is raised by poll(): returned here instead."""
        if self._producer is None:
            return None
        try:
            self._producer.poll(0)
        except KafkaException as exc:
            return exc.args[0] if isinstance(exc.args[0], KafkaError) else None
        return None

    def _failed(self, error: KafkaError, abortable: bool) -> tuple[KafkaError, str]:
        fenced = error.code() in FENCED_ERRORS or (error.fatal() and self.fatal_is_fence)
        if not fenced:
            log.warning("event=transaction_failed producer=%s error=%s fatal=%s", self.name, error, error.fatal())
        else:
            # A partition's producer is fenced when the partition moves: the owner of the store says so once, with
            # what it does next (cluster/ownership.py). Any other producer fenced means a second writer with our
            # transactional.id, which only an operator can resolve.
            log.log(logging.INFO if self.fatal_is_fence else logging.ERROR,
                    "event=state_producer_fenced producer=%s transactional_id=%s error=%s", self.name,
                    self.transactional_id, error)
            self._fenced = KafkaError(KafkaError._FENCED, f"fenced: {error.str()}")
            self._retire_blocking()
            return self._fenced, "fenced"
        if abortable and not error.fatal() and error.code() not in _UNANSWERED:
            return error, "abort"  # the broker answers: aborted (next, after the writes are told) and kept
        # Fatal, or the outcome unknown (the broker does not answer): never wait for this producer again.
        self._retire_blocking()
        return error, "retired"

    def _abort_blocking(self) -> str | None:
        if self._producer is None:
            return "retired"
        try:
            self._producer.abort_transaction(_ABORT_TIMEOUT_S)
            return None
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
        log.warning("event=transaction_abort_failed producer=%s error=%s", self.name, error)
        if error.code() in FENCED_ERRORS or (error.fatal() and self.fatal_is_fence):
            self._fenced = KafkaError(KafkaError._FENCED, f"fenced: {error.str()}")
            self._retire_blocking()
            return "fenced"
        self._retire_blocking()  # the fresh producer's init_transactions aborts it
        return "retired"

    def _retire_blocking(self) -> None:
        if self._producer is not None:
            holder, self._producer = [self._producer], None
            threading.Thread(target=_discard, args=(holder,), name=f"{self.name}-retire", daemon=True).start()

    def _destroy_blocking(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if self._initialised:
            _destroy(producer)
        else:  # its init_transactions timed out (broker down): close() would try an abort that conflicts with it
            _discard([producer])

    # -- flush and close -----------------------------------------------------------------------------------------
    async def flush(self, timeout_ms: int) -> int:
        """Wait until every queued write is committed or failed; returns how many are still waiting."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while (self._queue or self._in_flight) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return len(self._queue) + self._in_flight

    async def close(self, flush_timeout_ms: int = 5_000) -> None:
        """Finish the queued writes (bounded by `flush_timeout_ms`), then destroy the producer on its own thread,
        after any transaction still running there: never concurrently with a commit."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_timeout_ms / 1000
        self._closed = True
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
        self._fail_queued(KafkaError(KafkaError._DESTROY, "state producer closed"))
        destroyed = self._thread.submit(self._destroy_blocking)
        self._thread.stop()
        try:
            await asyncio.wait_for(destroyed, max(deadline - loop.time(), _MIN_TIMEOUT_S))
        except asyncio.TimeoutError:  # a commit the broker does not answer: it ends on its own, then the destroy
            log.warning("event=producer_close_pending producer=%s", self.name)


def _destroy(producer: Producer) -> None:
    """On a thread of ours, never by the cyclic GC (which may run on a librdkafka thread)."""
    producer.flush(1.0)
    producer.close()


def _discard(holder: list[Producer]) -> None:
    """A producer given up (fenced, failed, or its transaction's outcome unknown), on a thread of its own: the
    next write must not wait for it. It fails what it still holds, then it is destroyed by dropping its last
    reference here, not by close(): close() first aborts the open transaction, which a fenced producer cannot
    do, a commit left unfinished refuses ("Conflicting commit_transaction API call is already in progress"
    RuntimeWarning) and an unreachable broker makes wait. The newer holder of the id aborts it anyway."""
    holder[0].purge()
    try:
        holder[0].poll(0)
    except KafkaException:  # its fatal error (a fence), known already: nothing more to learn from it
        pass
    holder.clear()
