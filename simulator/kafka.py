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

from simulator.history import History
from simulator.ledger import Ledger

Record = tuple[int, bytes, bytes | None]  # (partition, key, value or None for a tombstone): the store's format


@dataclass(slots=True)
class LogRecord:
    offset: int
    key: bytes
    value: bytes | None
    time_ms: int


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
        self.next_offsets = [0] * partitions
        self.transactions: dict[str, Any] = {}  # transactional.id -> its TxnState (simulator/transactions.py)
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
        return offsets

    def read(self, partition: int) -> list[LogRecord]:
        return list(self.logs[partition])

    def compact(self, partition: int, active_records: int) -> int:
        """Kafka's log cleaner over everything but the active segment (the last `active_records` records): a
        record goes if a later record of its key is in the cleaned part; a tombstone goes once it is older than
        delete.retention.ms. Offsets are kept (the log has gaps). Returns the records removed."""
        log = self.logs[partition]
        cut = max(len(log) - active_records, 0)
        latest: dict[bytes, int] = {}
        for index in range(cut):
            latest[log[index].key] = index
        now_ms = self.now_ms()
        kept = [record for index, record in enumerate(log[:cut])
                if latest[record.key] == index
                and not (record.value is None and now_ms - record.time_ms >= self.faults.delete_retention_ms)]
        removed = cut - len(kept)
        self.logs[partition] = kept + log[cut:]
        if removed:
            self.history.record("compacted", partition=partition, removed=removed)
        return removed


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
        No record offsets are reported (`offsets` stays empty: the coordinator then orders by its own writes)."""
        return self._submit(records)

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
    def _submit(self, records: Sequence[Record]) -> asyncio.Future[KafkaError | None]:
        """One batch per partition (owed tombstones of several partitions go in one send); the outcome is the
        first error, once every batch is done."""
        loop = self.kafka.loop
        outcome: asyncio.Future[KafkaError | None] = loop.create_future()
        if self.dead:
            return outcome  # a dead process sends nothing; nobody awaits it either
        by_partition: dict[int, list[Record]] = {}
        for record in records:
            by_partition.setdefault(record[0], []).append(record)
        batches = [self._enqueue(partition, batch) for partition, batch in by_partition.items()]
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

    def _enqueue(self, partition: int, records: list[Record]) -> asyncio.Future[KafkaError | None]:
        loop = self.kafka.loop
        outcome: asyncio.Future[KafkaError | None] = loop.create_future()
        write_id = self.ledger.issued(self.name, partition, records)
        batch = _Batch(write_id, partition, records, self.kafka.now_ms(), outcome, ordered=loop.create_future())
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
        batch.outcome.set_result(error)

    def _land(self, batch: _Batch) -> None:
        offsets = self.kafka.append(batch.partition, batch.records)
        batch.landed = True
        self.ledger.landed(batch.write_id, offsets)

    @staticmethod
    def _settle(batch: _Batch) -> None:
        batch.settled = True
        if batch.ordered is not None and not batch.ordered.done():
            batch.ordered.set_result(None)

