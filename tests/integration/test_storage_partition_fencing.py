"""Partition fencing (StorageConfig.partition_fencing, issue 10 step 2) against a real broker: two stores share
one state topic as two instances would. Loading a partition fences its previous owner (a transactional producer
per partition, `init_transactions` before reading): the previous owner's appends fail NOT_COORDINATOR and it is
told once through `on_fenced`, the transaction it left open is aborted, and what it wrote before is loaded by
the new owner. Unloading gives a partition up cleanly (no fencing needed) and it can come back."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import KafkaException, Producer

from protocol.error_codes import Errors
from coordinator.group.partitioner import partition_for
from coordinator.group.store import StoreError
from coordinator.group.records import OffsetRecord
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.storage.records import OffsetCommitKey, encode_key, encode_offset_commit_value
from tests.support.kafka_store import read_back, started_store, unique_topic

pytestmark = pytest.mark.integration
PARTITIONS = 5
LOADED_MACHINE_TIMEOUT_MS = 30_000  # fencing and ownership are tested, not speed


@pytest.fixture(autouse=True)
def writer(state_writer: str) -> str:
    """Every test here once per transactional writer (the partitions' producers are librdkafka's or ours)."""
    return state_writer


def group_in(partition: int, name: str = "g") -> str:
    """A group id of `partition` (Kafka's partitioner)."""
    return next(f"{name}-{i}" for i in range(10_000) if partition_for(f"{name}-{i}", PARTITIONS) == partition)


def offsets(value: int, partitions: int = 3) -> dict[tuple[str, int], OffsetRecord]:
    return {("orders", p): OffsetRecord(value, commit_timestamp_ms=value) for p in range(partitions)}


def committed(loaded, group: str) -> dict[int, int]:  # type: ignore[no-untyped-def]
    return {p: r.offset for (_, p), r in loaded.offsets.get(group, {}).items()}


async def fencing_store(bootstrap: str, topic: str, fenced: list[int]) -> KafkaGroupStore:
    store = await started_store(bootstrap, topic, transactional_id=f"{topic}-coordinator", partition_fencing=True,
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    store.on_fenced = fenced.append
    return store


async def test_loading_a_partition_fences_its_previous_owner(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    first_fenced: list[int] = []
    second_fenced: list[int] = []
    first = await fencing_store(kafka_bootstrap, topic, first_fenced)
    second: KafkaGroupStore | None = None
    moved, kept = group_in(1), group_in(2)
    try:
        with pytest.raises(StoreError) as refused:  # nothing loaded yet: nothing owned
            await first.store_offsets(moved, offsets(1))
        assert refused.value.error == Errors.NOT_COORDINATOR

        await first.load(range(PARTITIONS))
        await first.store_offsets(moved, offsets(1))
        await first.store_offsets(kept, offsets(1))

        second = await fencing_store(kafka_bootstrap, topic, second_fenced)
        loaded = await second.load([1])
        assert committed(loaded, moved) == {0: 1, 1: 1, 2: 1}  # written by the first owner, loaded by the new
        assert kept not in loaded.offsets  # not asked for

        with pytest.raises(StoreError) as fenced:  # the zombie's write: refused, nothing of it visible
            await first.store_offsets(moved, offsets(2))
        assert fenced.value.error == Errors.NOT_COORDINATOR
        assert first_fenced == [1]  # told once, on the loop
        with pytest.raises(StoreError) as again:
            await first.store_offsets(moved, offsets(3))
        assert again.value.error == Errors.NOT_COORDINATOR
        assert first_fenced == [1]
        await first.store_offsets(kept, offsets(4))  # the partitions it still owns are unaffected

        await second.store_offsets(moved, offsets(5))
        reread = await second.load([1])  # already owned: kept (no self-fencing), read again
        assert committed(reread, moved) == {0: 5, 1: 5, 2: 5}
        assert second_fenced == []
    finally:
        await first.close()
        if second is not None:
            await second.close()
    loaded = await read_back(kafka_bootstrap, topic)
    assert {p: r.offset for (_, p), r in loaded[moved].items()} == {0: 5, 1: 5, 2: 5}
    assert {p: r.offset for (_, p), r in loaded[kept].items()} == {0: 4, 1: 4, 2: 4}


async def test_the_previous_owners_open_transaction_is_aborted(kafka_bootstrap: str) -> None:
    """The previous owner's producer of the partition (same transactional.id) has records in the log in a
    transaction it has not committed: the new owner's load aborts it, reads past it at once, and loads none of
    it; the previous owner can no longer commit it."""
    topic = unique_topic()
    fenced: list[int] = []
    store = await fencing_store(kafka_bootstrap, topic, fenced)
    group = group_in(3)
    zombie = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-coordinator-p3",
                       "transaction.timeout.ms": 300_000})  # never timed out by the broker during the test
    try:
        await asyncio.to_thread(zombie.init_transactions, 30)
        zombie.begin_transaction()
        zombie.produce(topic, partition=3, key=encode_key(OffsetCommitKey(group, "orders", 0)),
                       value=encode_offset_commit_value(OffsetRecord(99, commit_timestamp_ms=99)))
        assert await asyncio.to_thread(zombie.flush, 30) == 0  # in the log, uncommitted

        loaded = await asyncio.wait_for(store.load([3]), 60)  # not held back by the open transaction
        assert group not in loaded.offsets
        with pytest.raises(KafkaException) as refused:
            await asyncio.to_thread(zombie.commit_transaction, 30)
        assert refused.value.args[0].fatal()  # fenced
        await store.store_offsets(group, offsets(7))
        assert committed(await store.load([3]), group) == {0: 7, 1: 7, 2: 7}
        assert fenced == []
    finally:
        await asyncio.to_thread(zombie.purge)
        del zombie  # destroyed here: close() would try to abort the fenced transaction
        await store.close()


async def test_unload_then_load_elsewhere_and_back(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    a_fenced: list[int] = []
    b_fenced: list[int] = []
    a = await fencing_store(kafka_bootstrap, topic, a_fenced)
    b = await fencing_store(kafka_bootstrap, topic, b_fenced)
    group = group_in(4)
    try:
        await a.load([4])
        in_flight = asyncio.ensure_future(a.store_offsets(group, offsets(1)))
        await asyncio.sleep(0)  # queued before the unload: it finishes, the unload waits for it
        await a.unload([4])
        assert in_flight.done() and in_flight.exception() is None
        with pytest.raises(StoreError) as refused:
            await a.store_offsets(group, offsets(2))
        assert refused.value.error == Errors.NOT_COORDINATOR

        assert committed(await b.load([4]), group) == {0: 1, 1: 1, 2: 1}
        await b.store_offsets(group, offsets(3))
        await b.unload([4])

        assert committed(await a.load([4]), group) == {0: 3, 1: 3, 2: 3}  # back, with the other's write
        await a.store_offsets(group, offsets(4))
        assert committed(await a.load([4]), group) == {0: 4, 1: 4, 2: 4}
        assert a_fenced == [] and b_fenced == []  # a clean hand-over fences nobody who still writes
    finally:
        await a.close()
        await b.close()


async def test_many_partitions_are_fenced_in_parallel(kafka_bootstrap: str) -> None:
    """A takeover moves many partitions at once: they are fenced together, not one after another."""
    topic = unique_topic()
    first = await started_store(kafka_bootstrap, topic, partitions=20, transactional_id=f"{topic}-c",
                                partition_fencing=True, commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    second = await started_store(kafka_bootstrap, topic, partitions=20, transactional_id=f"{topic}-c",
                                 partition_fencing=True, commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    fenced: list[int] = []
    first.on_fenced = fenced.append
    groups = {f"group-{uuid.uuid4().hex[:8]}": i for i in range(40)}
    try:
        await first.load(range(20))
        await asyncio.gather(*(first.store_offsets(g, offsets(v)) for g, v in groups.items()))
        loaded = await second.load(range(20))
        assert {g: committed(loaded, g) for g in groups} == {g: {0: v, 1: v, 2: v} for g, v in groups.items()}
        assert all(second._fencing is not None and second._fencing.owns(p) for p in range(20))
        failures = await asyncio.gather(*(first.store_offsets(g, offsets(0)) for g in groups),
                                        return_exceptions=True)
        assert all(isinstance(f, StoreError) and f.error == Errors.NOT_COORDINATOR for f in failures)
        assert sorted(fenced) == sorted({partition_for(g, 20) for g in groups})  # once per partition
    finally:
        await first.close()
        await second.close()


async def test_a_fence_seen_in_the_middle_of_a_large_write_never_takes_the_partition_back(
        kafka_bootstrap: str) -> None:
    """A write of many records: the fence comes back for the first record's AddPartitionsToTxn while the later
    ones are still being produced, so produce() refuses them with _FATAL (not flagged fatal itself) and the cause
    is only in poll(). Taken for a producer failure, that used to retire the producer and initialise a fresh one
    with the same transactional.id: fencing the partition's new owner (seen once in CI)."""
    topic = unique_topic()
    first_fenced: list[int] = []
    second_fenced: list[int] = []
    first = await fencing_store(kafka_bootstrap, topic, first_fenced)
    second: KafkaGroupStore | None = None
    group = group_in(1)
    try:
        await first.load([1])
        await first.store_offsets(group, offsets(1))
        second = await fencing_store(kafka_bootstrap, topic, second_fenced)
        await second.load([1])

        with pytest.raises(StoreError) as fenced:
            await first.store_offsets(group, offsets(2, partitions=12_000))
        assert fenced.value.error == Errors.NOT_COORDINATOR
        assert first_fenced == [1]
        assert first._fencing is not None and not first._fencing.owns(1)

        await second.store_offsets(group, offsets(3))  # still the owner: nobody took the id back
        assert committed(await second.load([1]), group) == {0: 3, 1: 3, 2: 3}
        assert second_fenced == []
    finally:
        await first.close()
        if second is not None:
            await second.close()
