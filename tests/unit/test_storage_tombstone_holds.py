"""An owed tombstone superseded by newer writes of its key (coordinator/storage/tombstones.py, appender.py), on the
simulator's Kafka (its producer keeps a partition's writes in order and answers each by Kafka's rules; here Kafka
refuses exactly the writes a test says). Seed 18194 of the simulator: an older write's failure put the tombstone
back while a newer write of the key was in flight; the newer one was acknowledged, and the retry of the
tombstone landed after it, deleting the group memory and the acknowledged log held."""
from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from coordinator.group.records import OffsetCommitRecord, OffsetRecord
from coordinator.group.store import StoreError
from coordinator.storage.appender import RecordAppender
from coordinator.storage.records import OffsetCommitKey, decode_offset_commit_value, encode_key
from coordinator.storage.tombstones import TombstoneWriter
from simulator.history import History
from simulator.kafka import KafkaFaults, SimKafka, SimProducer
from simulator.ledger import Ledger
from simulator.loop import VirtualLoop

KEY = encode_key(OffsetCommitKey("g", "t", 0))


class Store:
    """The Kafka store's append path (RecordAppender, TombstoneWriter) over SimKafka's producer."""

    def __init__(self) -> None:
        self.loop = VirtualLoop(random.Random(0))
        history = History(self.loop.now_ms, keep=False)
        self.kafka = SimKafka(self.loop, self.loop.now_ms, random.Random(1), 1, KafkaFaults(), history)
        self.producer = SimProducer(self.kafka, "coordinator-0", 5_000, Ledger(history))
        self.tombstones = TombstoneWriter(3_600)  # sent again only when the test says
        self.appender = RecordAppender(self.tombstones, 1_000_000)

    def append(self, offset: int | None) -> asyncio.Future[None]:
        outcome: asyncio.Future[None] = self.loop.create_future()
        value = None if offset is None else OffsetRecord(offset)
        self.appender.append(self.producer, 0, [OffsetCommitRecord("g", "t", 0, value)], outcome)
        return outcome

    def refuse(self, refused: bool) -> None:
        self.kafka.faults.refuse = 1.0 if refused else 0.0

    def last_value(self) -> int | None:
        """The key's latest record in the log (None: a tombstone, or nothing)."""
        values = [r.value for r in self.kafka.logs[0] if r.key == KEY]
        last = values[-1] if values else None
        return None if last is None else decode_offset_commit_value(last).offset


async def settle(*outcomes: asyncio.Future[None]) -> list[BaseException | None]:
    return list(await asyncio.gather(*outcomes, return_exceptions=True))


async def owed_tombstone(store: Store) -> None:
    assert await settle(store.append(5)) == [None]
    store.refuse(True)
    [error] = await settle(store.append(None))  # the deletion: refused, owed
    assert isinstance(error, StoreError) and store.tombstones.unwritten == 1


def run(story: Callable[[Store], Awaitable[None]]) -> None:
    store = Store()

    async def and_stop() -> None:
        await story(store)
        store.tombstones.stop_retrying()
        await asyncio.sleep(0)

    store.loop.run_until_complete(and_stop())


def test_an_older_writes_failure_does_not_bring_the_tombstone_back_while_a_newer_write_succeeds() -> None:
    async def story(store: Store) -> None:
        await owed_tombstone(store)
        older = store.append(6)  # refused (Kafka still refusing when it is delivered)
        newer = store.append(7)  # issued while the older is in flight: holds the tombstone too
        older.add_done_callback(lambda _: store.refuse(False))  # Kafka takes the newer one
        older_error, newer_error = await settle(older, newer)
        assert isinstance(older_error, StoreError) and newer_error is None
        assert store.tombstones.unwritten == 0
        store.tombstones.retry_owed()  # the retrier's step, now: nothing to send
        await asyncio.sleep(1)
        assert store.last_value() == 7
    run(story)


def test_the_tombstone_is_owed_again_when_every_newer_write_failed() -> None:
    async def story(store: Store) -> None:
        await owed_tombstone(store)
        errors = await settle(store.append(6), store.append(7))  # both refused
        assert all(isinstance(e, StoreError) for e in errors)
        assert store.tombstones.unwritten == 1  # the deletion is still the truth: sent again
        store.refuse(False)
        store.tombstones.retry_owed()
        await asyncio.sleep(1)
        assert store.tombstones.unwritten == 0 and store.last_value() is None
    run(story)


def test_a_later_writes_failure_does_not_bring_back_a_tombstone_an_acknowledged_write_superseded() -> None:
    async def story(store: Store) -> None:
        await owed_tombstone(store)
        store.refuse(False)
        assert await settle(store.append(6)) == [None]
        store.refuse(True)
        assert isinstance((await settle(store.append(7)))[0], StoreError)
        assert store.tombstones.unwritten == 0
        store.refuse(False)
        store.tombstones.retry_owed()
        await asyncio.sleep(1)
        assert store.last_value() == 6
    run(story)
