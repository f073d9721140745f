"""librdkafka's state writer, given `markers_settle_ms` (StorageConfig's, serve --markers-settle-ms; 0 by default:
never), holds a transaction begun within that of the last commit's outcome until then (transaction_queue.py
`_begin_or_hold`): Kafka's transaction coordinator is still writing that commit's markers and would refuse the new
transaction's AddPartitionsToTxn (CONCURRENT_TRANSACTIONS), which librdkafka retries only after 20 ms. The writes
queued meanwhile join the held transaction; a transaction begun later is not held; nothing is opened ahead within
the window. The native writer (its own 1-ms retry) holds nothing. No broker: the transaction a writer would begin is
recorded instead."""

from __future__ import annotations

import asyncio
from confluent_kafka import KafkaError

from coordinator.storage.native_transactions import NativeTransactionalProducer
from coordinator.storage.outcome import Outcome
from coordinator.storage.records import OPEN_AHEAD_KEY
from coordinator.storage.transaction_queue import Queued
from coordinator.storage.transactions import TransactionalProducer

PARTITION = 1
SETTINGS = {"bootstrap.servers": "127.0.0.1:9"}  # never connected: nothing here reaches a broker


class Recording(TransactionalProducer):
    """The librdkafka writer with the transaction it begins recorded (loop time, writes) instead of committed."""

    def __init__(self) -> None:
        super().__init__("state", SETTINGS, "state-p1", "tid-p1", 5_000, markers_settle_ms=1.5)
        self._ready = True
        self.begun: list[tuple[float, int]] = []

    def _begin_commit(self, loop: asyncio.AbstractEventLoop) -> None:
        self.begun.append((loop.time(), len(self._queue)))
        self._queue = []


def queued(name: str) -> Queued:
    outcome: Outcome[KafkaError | None] = Outcome()
    return [(PARTITION, b"key-" + name.encode(), b"value")], outcome, asyncio.get_running_loop().time() + 5, None


async def until_begun(producer: Recording) -> None:
    for _ in range(2_000):  # bounded: 1 s at most
        if producer.begun:
            return
        await asyncio.sleep(0.0005)
    raise AssertionError("the held transaction never began")


async def test_a_transaction_right_after_a_commit_begins_once_its_markers_had_time_with_the_writes_queued_since() -> None:
    producer = Recording()
    loop = asyncio.get_running_loop()
    assert producer.markers_settle_s > 0
    producer._queue.append(queued("behind"))  # sent while the last transaction was being committed
    committed = [queued("committed")]
    producer._committing = (committed, loop.create_future())  # its worker not resumed yet: the hold needs it not
    producer._answer(committed, (None, None))
    committed_at = loop.time()
    assert producer.begun == []  # held
    producer._queue.append(queued("meanwhile"))
    await until_begun(producer)
    (began_at, writes), = producer.begun
    assert writes == 2 and began_at - committed_at >= producer.markers_settle_s * 0.9
    assert producer._hold is None


async def test_a_transaction_begun_after_the_window_is_not_held() -> None:
    producer = Recording()
    loop = asyncio.get_running_loop()
    producer._queue.append(queued("first"))
    producer._begin_or_hold(loop)  # no commit yet
    assert [writes for _, writes in producer.begun] == [1]
    producer._last_commit_at = loop.time() - 10 * producer.markers_settle_s
    producer._queue.append(queued("later"))
    producer._begin_or_hold(loop)
    assert [writes for _, writes in producer.begun] == [1, 1]


async def test_a_failed_transaction_holds_nothing() -> None:
    producer = Recording()
    loop = asyncio.get_running_loop()
    producer._answer([queued("refused")], (KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "refused"), "abort"))
    producer._queue.append(queued("next"))
    producer._begin_or_hold(loop)
    assert [writes for _, writes in producer.begun] == [1]


async def test_nothing_is_opened_ahead_within_the_window() -> None:
    producer = Recording()
    try:
        producer._answer([queued("committed")], (None, None))
        producer.open_ahead(PARTITION, (PARTITION, OPEN_AHEAD_KEY, None))
        assert not producer._opened_for and producer._open_ahead_expiry is None
        producer._last_commit_at -= 10 * producer.markers_settle_s
        producer.open_ahead(PARTITION, (PARTITION, OPEN_AHEAD_KEY, None))  # (no producer: its marker fails)
        assert producer._opened_for == {PARTITION} and producer._open_ahead_expiry is not None
    finally:
        producer._cancel_open_ahead_expiry()
        producer._thread.stop()


def test_the_writers_hold_nothing_unless_asked() -> None:
    assert TransactionalProducer("state", SETTINGS, "state-p1", "tid-p1", 5_000).markers_settle_s == 0


def test_the_native_writer_holds_nothing() -> None:
    native = NativeTransactionalProducer("state", SETTINGS, "state-p1", "tid-p1", 5_000)
    assert native.markers_settle_s == 0
