"""The simulated Kafka under the state store: per-partition logs of (key, value) records, a producer with Kafka's
acknowledgement rules, compaction and broker outages — on the virtual clock, every choice drawn from the seed.

What a write can become (the idempotent producer, acks=all, message.timeout.ms = the commit timeout):
  - acknowledged: it is in the log, in send order with the producer's other writes to that partition;
  - failed NOT_ENOUGH_REPLICAS: the leader refused it, it is not in the log (the only "failed" that means lost);
  - failed NOT_ENOUGH_REPLICAS_AFTER_APPEND: it *is* in the leader's log (Kafka's rule: written, not yet
    replicated) — reported failed, found again by the next load;
  - timed out (_MSG_TIMED_OUT after the commit timeout): the broker was down, or the acknowledgement was lost;
    it may or may not be in the log (both happen);
  - never answered: the producer's process crashed (`kill`); what was on the wire lands or not, decided then.
A broker outage holds every write until the broker is back or the write's timeout passes, fails loads, and
loses the acknowledgements of writes that landed just before it.

Every write, landing and outcome goes to the `Ledger`, the record of what the store was told, which the
invariant checkers read.
"""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from confluent_kafka import KafkaError

from coordinator.storage.records import OffsetCommitKey, decode_key
from protocol.fetch_reader import FetchedBatch, FetchedRecord, MarkerType
from simulator.history import History
from simulator.ledger import Ledger

Record = tuple[int, bytes, bytes | None]  # (partition, key, value or None for a tombstone): the store's format


@dataclass(frozen=True, slots=True)
class ClientBatch:
    """The batch a record of a client's producer came in (a TxnOffsetCommit's), or a COMMIT/ABORT marker
    (`marker` set, no key): what a read_uncommitted Fetch shows of it."""

    producer_id: int
    producer_epoch: int
    base_offset: int
    last_offset: int
    base_sequence: int = -1
    marker: MarkerType | None = None


@dataclass(slots=True)
class LogRecord:
    offset: int
    key: bytes
    value: bytes | None
    time_ms: int
    batch: ClientBatch | None = None  # None: a record of our own writers (committed when it is in the log)


@dataclass
class KafkaFaults:
    """Probabilities per write, and latencies in ms, drawn per seed."""

    refuse: float = 0.0  # NOT_ENOUGH_REPLICAS
    after_append: float = 0.0  # NOT_ENOUGH_REPLICAS_AFTER_APPEND
    ack_lost: float = 0.0  # landed, acknowledgement lost: times out
    land_ms: tuple[int, int] = (1, 10)
    ack_ms: tuple[int, int] = (0, 5)
    delete_retention_ms: int = 60_000  # tombstones stay this long after compaction reaches them


class SimKafka:
    def __init__(self, loop: asyncio.AbstractEventLoop, now_ms: Callable[[], int], rng: random.Random,
                 partitions: int, faults: KafkaFaults, history: History) -> None:
        self.loop = loop
        self.now_ms = now_ms
        self.rng = rng
        self.faults = faults
        self.history = history
        self.logs: list[list[LogRecord]] = [[] for _ in range(partitions)]
        # told (partition, key, offset) of each tombstone of ours that lands (the checkers follow our deletions)
        self.tombstone_landed: Callable[[int, bytes, int], None] | None = None
        self.next_offsets = [0] * partitions
        self.transactions: dict[str, Any] = {}  # transactional.id -> its TxnState (simulator/transactions.py)
        self._client_waiters: dict[int, list[asyncio.Future[None]]] = {}  # partition -> tails waiting for data
        self._down = False
        self._up: asyncio.Future[None] | None = None

    # --- outages ----------------------------------------------------------------------------------------------
    @property
    def is_up(self) -> bool:
        return not self._down

    def go_down(self) -> None:
        if not self._down:
            self._down = True
            self._up = self.loop.create_future()
            self.history.record("kafka_down")

    def come_up(self) -> None:
        if self._down:
            self._down = False
            assert self._up is not None
            up, self._up = self._up, None
            up.set_result(None)
            self.history.record("kafka_up")

    async def wait_up(self, deadline_ms: int) -> bool:
        """True once the broker is up, False if it is still down at `deadline_ms`."""
        while self._down:
            remaining_ms = deadline_ms - self.now_ms()
            if remaining_ms <= 0:
                return False
            assert self._up is not None
            try:
                await asyncio.wait_for(asyncio.shield(self._up), remaining_ms / 1000)
            except asyncio.TimeoutError:
                return False
        return True

    # --- the logs ---------------------------------------------------------------------------------------------
    def append(self, partition: int, records: Sequence[Record]) -> list[int]:
        log = self.logs[partition]
        offsets = []
        now_ms = self.now_ms()
        for _, key, value in records:
            offset = self.next_offsets[partition]
            self.next_offsets[partition] = offset + 1
            log.append(LogRecord(offset, key, value, now_ms))
            offsets.append(offset)
            if value is None and self.tombstone_landed is not None:
                self.tombstone_landed(partition, key, offset)
        if any(value is None and _is_offset_key(key) for _, key, value in records):
            self._client_data(partition)  # the tails read our offset tombstones too (txn_tail.TailReader)
        return offsets

    def append_client_batch(self, partition: int, producer_id: int, producer_epoch: int, base_sequence: int,
                            records: Sequence[tuple[bytes, bytes | None]]) -> int:
        """A client producer's transactional batch (a TxnOffsetCommit's offsets); its base offset."""
        base = self.next_offsets[partition]
        batch = ClientBatch(producer_id, producer_epoch, base, base + len(records) - 1, base_sequence)
        now_ms = self.now_ms()
        for index, (key, value) in enumerate(records):
            self.logs[partition].append(LogRecord(base + index, key, value, now_ms, batch))
        self.next_offsets[partition] = base + len(records)
        self._client_data(partition)
        return base

    def append_marker(self, partition: int, producer_id: int, producer_epoch: int, commit: bool) -> int:
        """The transaction coordinator's COMMIT or ABORT marker for a client's producer; its offset."""
        offset = self.next_offsets[partition]
        marker = MarkerType.COMMIT if commit else MarkerType.ABORT
        self.logs[partition].append(LogRecord(offset, b"", None, self.now_ms(),
                                              ClientBatch(producer_id, producer_epoch, offset, offset, -1, marker)))
        self.next_offsets[partition] = offset + 1
        self._client_data(partition)
        return offset

    def client_data(self, partition: int) -> asyncio.Future[None]:
        """Resolves when a client's batch, a marker or an offset tombstone of ours is next appended to the
        partition (a tail's long poll: nothing else our writers append concerns a tail)."""
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._client_waiters.setdefault(partition, []).append(waiter)
        return waiter

    def _client_data(self, partition: int) -> None:
        for waiter in self._client_waiters.pop(partition, []):
            if not waiter.done():
                waiter.set_result(None)

    def read(self, partition: int) -> list[LogRecord]:
        return list(self.logs[partition])

    def fetch(self, partition: int, start: int, end: int | None = None) -> list[FetchedBatch]:
        """The partition from `start` (to `end`) as a read_uncommitted Fetch parses it (protocol/fetch_reader.py):
        each of our records a batch of its own, a client's records in their batch, markers as control batches."""
        batches: list[FetchedBatch] = []
        current: list[LogRecord] = []

        def close() -> None:
            if current:
                batches.append(_fetched(current))
                current.clear()

        for record in self.logs[partition]:
            if record.offset < start or (end is not None and record.offset >= end):
                continue
            if current and (record.batch is None or record.batch is not current[0].batch):
                close()
            current.append(record)
        close()
        return batches

    def compact(self, partition: int, active_records: int) -> int:
        """Kafka's log cleaner over everything but the active segment (the last `active_records` records): a
        record goes if a later record of its key is in the cleaned part; a tombstone goes once it is older than
        delete.retention.ms. Offsets are kept (the log has gaps). Returns the records removed."""
        log = self.logs[partition]
        cut = min(max(len(log) - active_records, 0), _first_open(log))  # never past a client's open transaction
        aborted = _aborted_batches(log)  # below the cut every transaction has its marker (maybe past the cut)
        latest: dict[bytes, int] = {}
        for index in range(cut):  # an aborted record never supersedes (the cleaner's offset map skips them)
            batch = log[index].batch
            if batch is None or (batch.marker is None and id(batch) not in aborted and log[index].key):
                latest[log[index].key] = index
        now_ms = self.now_ms()
        # markers stay (the cleaner drops one only with the last record of its transaction: keeping it is safe),
        # and so do emptied batches' headers (key b"")
        kept = [record for index, record in enumerate(log[:cut])
                if (record.batch is not None and (record.batch.marker is not None or not record.key))
                or (latest.get(record.key) == index
                    and not (record.value is None and now_ms - record.time_ms >= self.faults.delete_retention_ms))]
        kept = _with_last_batches(log, log[:cut], kept)
        removed = cut - len(kept)
        self.logs[partition] = kept + log[cut:]
        if removed:
            self.history.record("compacted", partition=partition, removed=removed)
        return removed


def _is_offset_key(key: bytes) -> bool:
    return isinstance(decode_key(key), OffsetCommitKey)


def _fetched(records: list[LogRecord]) -> FetchedBatch:
    batch = records[0].batch
    if batch is None:
        record = records[0]
        return FetchedBatch(record.offset, record.offset, -1, -1, -1, False, False, None,
                            (FetchedRecord(record.offset, record.key, record.value),))
    if batch.marker is not None:
        return FetchedBatch(batch.base_offset, batch.last_offset, batch.producer_id, batch.producer_epoch, -1,
                            True, True, batch.marker, ())
    return FetchedBatch(batch.base_offset, batch.last_offset, batch.producer_id, batch.producer_epoch,
                        batch.base_sequence, True, False, None,
                        tuple(FetchedRecord(r.offset, r.key, r.value) for r in records if r.key))


def _with_last_batches(log: list[LogRecord], cleaned: list[LogRecord], kept: list[LogRecord]) -> list[LogRecord]:
    """Kafka's cleaner keeps the last batch of every producer, emptied of its records if they all go, so that
    the producer's sequence survives (LogCleaner: lastRecordsOfActiveProducers); an emptied batch is its header
    alone here (a record without key)."""
    last: dict[int, ClientBatch] = {}
    for record in log:
        if record.batch is not None and record.batch.marker is None:
            last[record.batch.producer_id] = record.batch
    wanted = {id(batch) for batch in last.values()} - {id(r.batch) for r in kept if r.batch is not None}
    if not wanted:
        return kept
    kept_ids = {id(r) for r in kept}
    result: list[LogRecord] = []
    for record in cleaned:
        if id(record) in kept_ids:
            result.append(record)
        elif record.batch is not None and id(record.batch) in wanted:
            wanted.discard(id(record.batch))
            result.append(LogRecord(record.batch.base_offset, b"", None, record.time_ms, record.batch))
    return result


def _first_open(log: list[LogRecord]) -> int:
    """The index of the first record of a client transaction with no marker yet (the last stable offset), or the
    log's length."""
    open_at: dict[int, int] = {}
    for index, record in enumerate(log):
        batch = record.batch
        if batch is None:
            continue
        if batch.marker is not None:
            open_at.pop(batch.producer_id, None)
        else:
            open_at.setdefault(batch.producer_id, index)
    return min(open_at.values(), default=len(log))


def _aborted_batches(log: list[LogRecord]) -> set[int]:
    """The ids of the client batches an ABORT marker ended (the cleaner removes their records)."""
    held: dict[int, list[ClientBatch]] = {}
    aborted: set[int] = set()
    for record in log:
        batch = record.batch
        if batch is None:
            continue
        if batch.marker is None:
            if not held.get(batch.producer_id) or held[batch.producer_id][-1] is not batch:
                held.setdefault(batch.producer_id, []).append(batch)
        elif batch.marker == MarkerType.ABORT:
            aborted.update(id(b) for b in held.pop(batch.producer_id, []))
        else:
            held.pop(batch.producer_id, None)
    return aborted


@dataclass(eq=False)
class _Batch:
    write_id: int
    partition: int
    records: list[Record]
    sent_ms: int
    outcome: asyncio.Future[KafkaError | None]
    landed: bool = False
    settled: bool = False  # landed or known never to land
    ordered: asyncio.Future[None] | None = field(default=None)  # set once settled: the next batch may go
    report: list[int] | None = None  # told the records' offsets when acknowledged (librdkafka's delivery reports)
    offsets: list[int] = field(default_factory=list)  # where it landed


class SimProducer:
    """The state store's producer (coordinator/storage/producer.py RecordSender, as AsyncProducer) on SimKafka.
    One per coordinator process; `kill` is the process dying."""

    def __init__(self, kafka: SimKafka, name: str, timeout_ms: int, ledger: Ledger) -> None:
        self.kafka = kafka
        self.name = name
        self.timeout_ms = timeout_ms
        self.ledger = ledger
        self.dead = False
        self._tail: dict[int, asyncio.Future[None]] = {}  # partition -> settles when its last batch has
        self._in_flight: dict[int, _Batch] = {}
        self._abandoned: list[_Batch] = []  # kept, so nothing of a dead process is collected (and run) mid-run

    def send(self, records: Sequence[Record], *, offsets: list[int] | None = None
             ) -> asyncio.Future[KafkaError | None]:
        """Queues the records now (in order with every other write to their partition); the future resolves
        with None once they are acknowledged, else the error (coordinator/storage/producer.py RecordSender).
        Once acknowledged, `offsets` gets the records' offsets, as librdkafka's delivery reports give them."""
        return self._submit(records, offsets)

    def open_ahead(self, partition: int, marker: Record) -> None:
        """Nothing to prepare: AsyncProducer's (no transaction to open ahead of a write)."""

    async def flush(self, timeout_ms: int) -> int:
        return 0

    async def close(self, flush_timeout_ms: int = 5_000) -> None:
        """librdkafka's close: flush what is in flight (bounded), then the process exits with the rest."""
        deadline_ms = self.kafka.now_ms() + flush_timeout_ms
        while self._in_flight and self.kafka.now_ms() < deadline_ms:
            await asyncio.sleep(0.01)
        self.kill()

    def kill(self) -> None:
        """The process is gone: what is on the wire lands now or never, and nobody hears about it."""
        self.dead = True
        for batch in list(self._in_flight.values()):
            if not batch.settled:
                if self.kafka.rng.random() < 0.5 and self.kafka.is_up:
                    self._land(batch)
                self._settle(batch)
            self.ledger.outcome(batch.write_id, "crashed")
        self._abandoned.extend(self._in_flight.values())
        self._in_flight.clear()

    # --- internals --------------------------------------------------------------------------------------------
    def _submit(self, records: Sequence[Record], report: list[int] | None = None
                ) -> asyncio.Future[KafkaError | None]:
        """One batch per partition (owed tombstones of several partitions go in one send); the outcome is the
        first error, once every batch is done."""
        loop = self.kafka.loop
        outcome: asyncio.Future[KafkaError | None] = loop.create_future()
        if self.dead:
            return outcome  # a dead process sends nothing; nobody awaits it either
        by_partition: dict[int, list[Record]] = {}
        for record in records:
            by_partition.setdefault(record[0], []).append(record)
        batches = [self._enqueue(partition, batch, report) for partition, batch in by_partition.items()]
        if len(batches) == 1:
            return batches[0]
        remaining = [len(batches)]
        errors: list[KafkaError] = []

        def one_done(done: asyncio.Future[KafkaError | None]) -> None:
            if done.result() is not None:
                errors.append(done.result())  # type: ignore[arg-type]
            remaining[0] -= 1
            if remaining[0] == 0 and not outcome.done():
                outcome.set_result(errors[0] if errors else None)

        for batch in batches:
            batch.add_done_callback(one_done)
        return outcome

    def _enqueue(self, partition: int, records: list[Record], report: list[int] | None = None
                 ) -> asyncio.Future[KafkaError | None]:
        loop = self.kafka.loop
        outcome: asyncio.Future[KafkaError | None] = loop.create_future()
        write_id = self.ledger.issued(self.name, partition, records)
        batch = _Batch(write_id, partition, records, self.kafka.now_ms(), outcome, ordered=loop.create_future(),
                       report=report)
        previous = self._tail.get(partition)
        assert batch.ordered is not None
        self._tail[partition] = batch.ordered
        self._in_flight[write_id] = batch
        loop.create_task(self._deliver(batch, previous))
        return outcome

    async def _deliver(self, batch: _Batch, previous: asyncio.Future[None] | None) -> None:
        kafka, faults, rng = self.kafka, self.kafka.faults, self.kafka.rng
        deadline_ms = batch.sent_ms + self.timeout_ms
        if previous is not None:
            await previous  # the idempotent producer keeps a partition's writes in order
        if self.dead:
            return
        error: KafkaError | None = None
        if await kafka.wait_up(deadline_ms) and not self.dead:
            await asyncio.sleep(rng.randint(*faults.land_ms) / 1000)
            if self.dead:
                return
            roll = rng.random()
            if kafka.now_ms() >= deadline_ms:
                error = KafkaError(KafkaError._MSG_TIMED_OUT)
            elif not kafka.is_up:  # went down while the write was on its way: in the log or not
                if roll < 0.5:
                    self._land(batch)
                error = KafkaError(KafkaError._MSG_TIMED_OUT)
            elif roll < faults.refuse:
                error = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS)
            elif roll < faults.refuse + faults.after_append:
                self._land(batch)
                error = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
            else:
                self._land(batch)
                if roll >= 1 - faults.ack_lost:
                    error = KafkaError(KafkaError._MSG_TIMED_OUT)
        else:
            error = KafkaError(KafkaError._MSG_TIMED_OUT)
        if self.dead:
            return
        self._settle(batch)
        if error is not None and error.code() == KafkaError._MSG_TIMED_OUT:
            await asyncio.sleep(max(deadline_ms - kafka.now_ms(), 0) / 1000)
        elif error is None:
            await asyncio.sleep(rng.randint(*faults.ack_ms) / 1000)
            if not kafka.is_up:  # the acknowledgement was lost in the outage
                error = KafkaError(KafkaError._MSG_TIMED_OUT)
                await asyncio.sleep(max(deadline_ms - kafka.now_ms(), 0) / 1000)
        if self.dead:
            return
        self._in_flight.pop(batch.write_id, None)
        self.ledger.outcome(batch.write_id, "acked" if error is None else error.name())
        if error is None and batch.report is not None:
            batch.report.extend(batch.offsets)
        batch.outcome.set_result(error)

    def _land(self, batch: _Batch) -> None:
        offsets = batch.offsets = self.kafka.append(batch.partition, batch.records)
        batch.landed = True
        self.ledger.landed(batch.write_id, offsets)

    @staticmethod
    def _settle(batch: _Batch) -> None:
        batch.settled = True
        if batch.ordered is not None and not batch.ordered.done():
            batch.ordered.set_result(None)

