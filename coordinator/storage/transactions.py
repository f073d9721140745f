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
one left open and fences it, which is how several instances (issue 10, step 2) will take a partition over.
A fenced producer stays fenced: every later write fails (the store reports NOT_COORDINATOR), it never takes
the id back. A producer that failed fatally for another reason is replaced by a fresh one.
The client's calls block, so each transaction runs in a worker thread; the event loop never waits on them.

One producer has one transaction in flight at a time, so `TransactionalWriters` keeps a few, each owning a
fixed share of the partitions (partition % count): transactions of different shares run in parallel, and a
partition's writes stay in order because they always go through the same producer. Several instances would
give each owned partition its own id instead (issue 10, step 2).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Producer

from coordinator.storage.producer import Record

log = logging.getLogger("coordinator.storage")
_MIN_TIMEOUT_S = 0.5  # a transaction started late still gets this long

# A newer producer holds our transactional.id: we must not write again.
FENCED_ERRORS = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


class TransactionalProducer:
    """Same surface as AsyncProducer (send, send_then, flush, close), every write inside a transaction."""

    def __init__(self, topic: str, settings: dict[str, object], name: str, transactional_id: str,
                 timeout_ms: int) -> None:
        self.topic = topic
        self.name = name
        self.timeout_ms = timeout_ms
        self._settings = {k: v for k, v in settings.items() if k not in ("enable.idempotence", "acks")}
        self._settings.update({"transactional.id": transactional_id,
                               "transaction.timeout.ms": max(timeout_ms * 2, 10_000)})
        self._settings.setdefault("logger", logging.getLogger(f"coordinator.storage.librdkafka.{name}"))
        self._producer: Producer | None = None
        # (records, future, deadline in loop time): a write fails once it has waited the commit timeout
        self._queue: list[tuple[Sequence[Record], asyncio.Future[KafkaError | None], float]] = []
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._closed = False
        self._fenced: KafkaError | None = None
        self.transactions = 0  # committed or aborted, for benchmarks and tests

    async def start(self, timeout_ms: int = 60_000) -> None:
        """Create the producer and register its transactional.id (fences an older holder of the id). A cluster
        still starting answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS for a while: retried until
        `timeout_ms`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            try:
                await asyncio.to_thread(self._ensure_producer, self.timeout_ms / 1000)
                break
            except KafkaException as exc:
                error = exc.args[0]
                if not isinstance(error, KafkaError) or error.fatal() or loop.time() > deadline:
                    raise
                log.info("event=transactions_init_retry producer=%s error=%s", self.name, error)
                await asyncio.sleep(0.5)
        self._worker = asyncio.get_running_loop().create_task(self._run(), name=f"{self.name}-transactions")

    async def send(self, records: Sequence[Record]) -> KafkaError | None:
        """Append `records` in the next transaction; None once it is committed, else its error (never raises)."""
        return await self._enqueue(records)

    def send_then(self, records: Sequence[Record], on_done: Callable[[KafkaError | None], object]) -> None:
        self._enqueue(records).add_done_callback(lambda done: on_done(done.result()))

    def _enqueue(self, records: Sequence[Record]) -> asyncio.Future[KafkaError | None]:
        future: asyncio.Future[KafkaError | None] = asyncio.get_running_loop().create_future()
        if self._closed or self._worker is None:
            future.set_result(KafkaError(KafkaError._DESTROY, "state producer closed"))
        elif not records:
            future.set_result(None)
        else:
            loop = asyncio.get_running_loop()
            self._queue.append((records, future, loop.time() + self.timeout_ms / 1000))
            self._wake.set()
        return future

    async def _run(self) -> None:
        while not self._closed or self._queue:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._queue = self._queue, []
            now = asyncio.get_running_loop().time()
            expired = [item for item in batch if item[2] <= now]
            batch = [item for item in batch if item[2] > now]
            for _, future, _ in expired:  # waited out their commit timeout behind a slow transaction
                if not future.done():
                    future.set_result(KafkaError(KafkaError._MSG_TIMED_OUT, "not written within the commit timeout"))
            if not batch:
                continue
            timeout_s = max(min(deadline for _, _, deadline in batch) - now, _MIN_TIMEOUT_S)
            try:
                error = await asyncio.to_thread(self._transaction, [r for records, _, _ in batch for r in records],
                                                timeout_s)
            except Exception as exc:  # our bug, not Kafka's: fail the writes rather than hang them
                log.exception("event=transaction_crashed producer=%s", self.name)
                error = KafkaError(KafkaError._FAIL, f"transaction failed: {exc}")
            self.transactions += 1
            for _, future, _ in batch:
                if not future.done():
                    future.set_result(error)

    def _ensure_producer(self, timeout_s: float) -> Producer:
        if self._producer is None:
            producer = Producer(self._settings)
            try:
                producer.init_transactions(timeout_s)
            except BaseException:
                _retire(producer)  # never left to the cyclic GC, which may run on a librdkafka thread
                raise
            self._producer = producer
        return self._producer

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    def _transaction(self, records: list[Record], timeout_s: float) -> KafkaError | None:
        """Blocking (worker thread): one transaction with every record, committed within `timeout_s` or not
        at all."""
        if self._fenced is not None:
            return self._fenced
        try:
            producer = self._ensure_producer(timeout_s)
        except KafkaException as exc:
            return self._failed(exc.args[0], None)
        try:
            producer.begin_transaction()
            for partition, key, value in records:
                producer.produce(self.topic, value=value, key=key, partition=partition)
            producer.commit_transaction(timeout_s)
            return None
        except KafkaException as exc:
            return self._failed(exc.args[0], producer)
        except BufferError:
            return self._failed(KafkaError(KafkaError._QUEUE_FULL, "producer queue full"), producer)

    def _failed(self, error: KafkaError, producer: Producer | None) -> KafkaError:
        log.warning("event=transaction_failed producer=%s error=%s fatal=%s", self.name, error,
                    bool(error.fatal()) if isinstance(error, KafkaError) else None)
        if error.code() in FENCED_ERRORS:
            log.error("event=state_producer_fenced producer=%s error=%s", self.name, error)
            error = self._fenced = KafkaError(KafkaError._FENCED, f"fenced: {error.str()}")
        if producer is None:
            return error
        if not error.fatal() and self._fenced is None and error.txn_requires_abort():
            try:  # the broker is there and answers: abort at once and keep the producer
                producer.abort_transaction(_MIN_TIMEOUT_S)
                return error
            except KafkaException as abort:
                log.warning("event=transaction_abort_failed producer=%s error=%s", self.name, abort.args[0])
        # Fenced, fatal, or the outcome unknown (the broker does not answer): never wait for this producer again.
        # The next transaction starts a fresh one, whose init_transactions aborts whatever this one left open.
        self._producer = None
        _retire(producer)
        return error

    async def flush(self, timeout_ms: int) -> int:
        """Wait until every queued write is committed or failed; returns how many are still queued."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while self._queue and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return len(self._queue)

    async def close(self, flush_timeout_ms: int = 5_000) -> None:
        self._closed = True
        self._wake.set()
        if self._worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._worker), flush_timeout_ms / 1000)
            except asyncio.TimeoutError:
                self._worker.cancel()
        producer, self._producer = self._producer, None
        if producer is not None:
            await asyncio.to_thread(_destroy, producer)
        for _, future in self._queue:
            if not future.done():
                future.set_result(KafkaError(KafkaError._DESTROY, "state producer closed"))
        self._queue.clear()


def _destroy(producer: Producer) -> None:
    """On a thread of ours, never by the cyclic GC (which may run on a librdkafka thread)."""
    producer.flush(1.0)
    producer.close()


def _retire(producer: Producer) -> None:
    """Drop what the producer holds and destroy it on a thread of its own: destroying a producer with a
    transaction open may wait on an unreachable broker, and the next write must not wait with it."""
    producer.purge()
    threading.Thread(target=_destroy, args=(producer,), name="state-producer-retire", daemon=True).start()


class TransactionalWriters:
    """`count` transactional producers (ids `<transactional_id>-<k>`), partition p written by producer p % count.
    Same surface as AsyncProducer; a send spanning partitions (tombstone retries) is split by producer and
    resolves with the first error."""

    def __init__(self, topic: str, settings: dict[str, object], name: str, transactional_id: str,
                 timeout_ms: int, count: int) -> None:
        self.topic = topic
        self.name = name
        self.timeout_ms = timeout_ms
        self.producers = [TransactionalProducer(topic, settings, f"{name}-{k}", f"{transactional_id}-{k}",
                                                timeout_ms) for k in range(count)]

    @property
    def transactions(self) -> int:
        return sum(p.transactions for p in self.producers)

    async def start(self, timeout_ms: int = 60_000) -> None:
        await asyncio.gather(*(p.start(timeout_ms) for p in self.producers))

    async def send(self, records: Sequence[Record]) -> KafkaError | None:
        shares = self._split(records)
        if len(shares) == 1:
            ((k, share),) = shares.items()
            return await self.producers[k].send(share)
        errors = await asyncio.gather(*(self.producers[k].send(share) for k, share in shares.items()))
        return next((e for e in errors if e is not None), None)

    def send_then(self, records: Sequence[Record], on_done: Callable[[KafkaError | None], object]) -> None:
        task = asyncio.get_running_loop().create_task(self.send(records))
        task.add_done_callback(lambda done: on_done(done.result()))

    def _split(self, records: Sequence[Record]) -> dict[int, list[Record]]:
        shares: dict[int, list[Record]] = {}
        for record in records:
            shares.setdefault(record[0] % len(self.producers), []).append(record)
        return shares or {0: []}

    async def flush(self, timeout_ms: int) -> int:
        remaining = await asyncio.gather(*(p.flush(timeout_ms) for p in self.producers))
        return sum(remaining)

    async def close(self, flush_timeout_ms: int = 5_000) -> None:
        await asyncio.gather(*(p.close(flush_timeout_ms) for p in self.producers))
