"""The Kafka-backed store with a transactional producer (coordinator/storage/transactions.py) against a real
broker: concurrent writes share transactions and all become visible; a write that fails leaves nothing behind;
a second store with the same transactional.id fences the first (the fence of several instances, issue 10); a
load ends at the high watermark, so it sees a transaction committed a moment before, and never an open or
aborted one."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from protocol.error_codes import Errors
from coordinator.group.store import StoreError
from coordinator.group.records import OffsetRecord, offset_commits
from coordinator.storage.kafka_store import KafkaGroupStore, loaded_offset_records
from coordinator.storage.loader import consumer_settings, read_state_with_transactions
from coordinator.timer.clock import MonotonicClock
from coordinator.storage.records import OffsetCommitKey, encode_key, encode_offset_commit_value
from coordinator.storage.partition_writers import TransactionalWriters
from tests.support.kafka_store import read_back, stable_group, started_store, unique_topic

pytestmark = pytest.mark.integration
LOADED_MACHINE_TIMEOUT_MS = 30_000  # what is tested is atomicity and fencing, not speed: a slow broker must not fail it


def offsets(value: int, partitions: int) -> dict[tuple[str, int], OffsetRecord]:
    return {("orders", p): OffsetRecord(value, commit_timestamp_ms=value) for p in range(partitions)}


async def test_concurrent_writes_share_transactions_and_are_all_visible(kafka_bootstrap: str, state_writer: str) -> None:
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-writer",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    try:
        writes = [store.store_offsets(f"g{i}", offsets(i, 20)) for i in range(40)]
        writes.append(store.store_group("g0", stable_group(generation=3)))
        await asyncio.gather(*writes)
        producer = store._producer
        assert isinstance(producer, TransactionalWriters)
        assert 1 <= producer.transactions < 41  # group commit: fewer transactions than writes
    finally:
        await store.close()
    # Read once, at once: the load ends at the high watermark, so the last transactions' commit markers (which
    # land after commit_transaction returns) are waited for, not missed.
    reader = await started_store(kafka_bootstrap, topic)
    try:
        state = await reader.read()
    finally:
        await reader.close()
    loaded = loaded_offset_records(state)
    assert {g: {tp: r.offset for tp, r in offs.items()} for g, offs in loaded.items()} == {
        f"g{i}": {("orders", p): i for p in range(20)} for i in range(40)}
    assert state.groups["g0"].generation == 3


@pytest.mark.parametrize("settle_s", [0.0, 0.0015])
async def test_writes_queued_behind_a_commit_start_theirs_as_its_result_arrives(kafka_bootstrap: str,
                                                                              settle_s: float) -> None:
    """A write queued while a transaction is in flight is in the next transaction by the time the first write's
    waiters run (its result's own callback began it), not a loop turn later; or, with the writer's
    `markers_settle_s` (StorageConfig.markers_settle_ms), that callback holds it and the hold's timer begins it;
    both are committed."""
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-writer",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    try:
        writers = store._producer
        assert isinstance(writers, TransactionalWriters)
        producer = writers.producers[0]
        producer.markers_settle_s = settle_s
        loop = asyncio.get_running_loop()
        record = [(0, b"k1", b"v1")]
        first = producer.send(record)  # starts a transaction at once
        second = producer.send([(0, b"k2", b"v2")])  # queued behind it
        seen: list[tuple[bool, bool]] = []
        outcome_at: list[float] = []

        def in_next() -> bool:
            return producer._committing is not None and any(q[1] is second for q in producer._committing[0])

        first.add_done_callback(lambda _done: (outcome_at.append(loop.time()),
                                               seen.append((in_next(), producer._hold is not None))))
        assert await asyncio.wait_for(first, 60) is None
        if producer.markers_settle_s == 0:
            assert seen == [(True, False)]
        else:
            assert seen == [(False, True)]  # held: its timer begins it
            for _ in range(1_000):  # bounded: 1 s at most
                if in_next():
                    break
                await asyncio.sleep(0.001)
            assert in_next() and loop.time() - outcome_at[0] <= 0.5
        assert await asyncio.wait_for(second, 60) is None
        assert producer._committing is None or all(q[1] is not second for q in producer._committing[0])
    finally:
        await store.close()


async def test_a_newer_holder_of_the_transactional_id_fences_the_older(kafka_bootstrap: str, state_writer: str,
                                                                     recwarn: pytest.WarningsRecorder) -> None:
    topic = unique_topic()
    first = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-p0",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    second: KafkaGroupStore | None = None
    try:
        await first.store_offsets("g", offsets(1, 3))
        second = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-p0",
                                     commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
        with pytest.raises(StoreError) as failed:
            await first.store_offsets("g", offsets(2, 3))  # a zombie's write: refused, nothing visible
        assert failed.value.error == Errors.NOT_COORDINATOR
        with pytest.raises(StoreError):  # fenced for good: it never takes the id back
            await first.store_offsets("g", offsets(4, 3))
        await second.store_offsets("g", offsets(3, 3))
    finally:
        await first.close()
        if second is not None:
            await second.close()
    loaded = await read_back(kafka_bootstrap, topic)
    assert {tp: r.offset for tp, r in loaded["g"].items()} == {("orders", p): 3 for p in range(3)}
    assert close_warnings(recwarn) == []  # the fenced producer is discarded, not closed (close would abort)


async def test_a_load_right_after_a_commit_sees_it(kafka_bootstrap: str, state_writer: str) -> None:
    """Every write is read back by a load started the moment it is acknowledged. With the last stable offset
    as the end (what a read_committed consumer's watermarks answer) a load could stop before the commit marker
    and miss the acknowledged write."""
    topic = unique_topic()
    writer = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-writer",
                                 commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    reader = await started_store(kafka_bootstrap, topic)
    partition = writer._partition("g")
    try:
        for value in range(1, 16):
            await writer.store_offsets("g", offsets(value, 3))
            loaded = loaded_offset_records(await reader.read([partition]))
            assert {tp: r.offset for tp, r in loaded["g"].items()} == {("orders", p): value for p in range(3)}
    finally:
        await writer.close()
        await reader.close()


def offset_record(group: str, partition: int, value: int) -> tuple[bytes, bytes]:
    return (encode_key(OffsetCommitKey(group, "orders", partition)),
            encode_offset_commit_value(OffsetRecord(value, commit_timestamp_ms=value)))


async def test_a_load_skips_aborted_records_and_returns_an_open_transaction_as_pending(kafka_bootstrap: str) -> None:
    """Read read_uncommitted to the high watermark with our own transaction tracking: an aborted transaction is
    never loaded; a client transaction still open on the partition does not hold the load back, it comes back
    as pending (its producer and its decoded offset commit) and is applied once committed."""
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic)
    partition = store._partition("g")
    other = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-{uuid.uuid4().hex}"})
    try:
        await store.store_offsets("g", offsets(1, 1))
        await asyncio.to_thread(other.init_transactions, 30)
        other.begin_transaction()
        key, value = offset_record("g", 0, 2)
        other.produce(topic, key=key, value=value, partition=partition)
        await asyncio.to_thread(other.abort_transaction, 30)
        loaded = loaded_offset_records(await store.read([partition]))
        assert loaded["g"][("orders", 0)].offset == 1  # the aborted write is not there

        other.begin_transaction()
        key, value = offset_record("g", 0, 3)
        other.produce(topic, key=key, value=value, partition=partition)
        await asyncio.to_thread(other.flush, 30)  # in the log, below the high watermark, not committed
        store.load_timeout_ms = 10_000
        loaded = loaded_offset_records(await store.read([partition]))  # not held back by the open transaction
        assert loaded["g"][("orders", 0)].offset == 1
        settings = consumer_settings(kafka_bootstrap, "test", 1 << 20)
        _state, load = await asyncio.to_thread(read_state_with_transactions, settings, topic, [partition],
                                               MonotonicClock(), 10_000)
        assert load is not None
        [pending] = load.pending[partition]
        [commit] = pending.offset_commits
        assert (commit.key, commit.value.offset if commit.value else None) == (OffsetCommitKey("g", "orders", 0), 3)
        await asyncio.to_thread(other.commit_transaction, 30)
        loaded = loaded_offset_records(await store.read([partition]))
        assert loaded["g"][("orders", 0)].offset == 3
    finally:
        await asyncio.to_thread(other.close)
        await store.close()


def close_warnings(recwarn: pytest.WarningsRecorder) -> list[str]:
    """librdkafka's complaints when a producer is destroyed with a transaction it cannot abort."""
    return [str(w.message) for w in recwarn if "during close" in str(w.message)]


@pytest.mark.parametrize("close_timeout_ms", [5_000, 1])
async def test_close_never_destroys_the_producer_during_a_commit(kafka_bootstrap: str, close_timeout_ms: int,
                                                                 recwarn: pytest.WarningsRecorder) -> None:
    """close() while a commit runs, with time to finish it (5 s) or none (1 ms: it stops waiting at once). The
    producer is destroyed after the commit, on its own thread, never concurrently (librdkafka would refuse the
    abort of close(): "Conflicting commit_transaction API call is already in progress"); every write is
    answered (a write close stopped waiting for: REQUEST_TIMED_OUT, outcome unknown) and what was acknowledged
    is there."""
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-writer",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS, transactional_producers=1)
    writes = [asyncio.ensure_future(store.store_offsets(f"g{i}", offsets(i, 5))) for i in range(1, 201)]
    writers = store._producer
    assert isinstance(writers, TransactionalWriters)
    producer = writers.producers[0]
    while producer._in_flight == 0:  # a transaction is being committed
        await asyncio.sleep(0.001)
    await producer.close(close_timeout_ms)
    await store.close()
    outcomes = await asyncio.wait_for(asyncio.gather(*writes, return_exceptions=True), 10)
    assert all(o is None or (isinstance(o, StoreError) and o.error in (Errors.REQUEST_TIMED_OUT,
                                                                       Errors.COORDINATOR_NOT_AVAILABLE))
               for o in outcomes), outcomes
    for _ in range(3000):  # the destroy runs once the commit is done
        if producer._client.producer is None:
            break
        await asyncio.sleep(0.01)
    assert producer._client.producer is None
    assert close_warnings(recwarn) == []
    acknowledged = {f"g{i}" for i, o in zip(range(1, 201), outcomes) if o is None}
    if close_timeout_ms > 1_000:
        assert acknowledged  # the transaction in flight was waited for
    loaded = await read_back(kafka_bootstrap, topic)
    assert acknowledged <= set(loaded)


async def test_a_lone_write_is_committed_while_the_loop_is_busy(kafka_bootstrap: str) -> None:
    """A write sent while no transaction is in flight starts its transaction from send(), not a loop turn later:
    it becomes visible to a read_committed reader while the loop is still busy (here: blocked by this test, as a
    thousand SyncGroups arriving at once keep it busy after the leader's). The librdkafka writer's
    alone: the native writer's requests are sent from the loop (its `send` starts the transaction task, which
    runs at the loop's next turn; tests/integration/test_storage_native_transactions.py covers its group commit)."""
    topic = unique_topic()
    store = await started_store(kafka_bootstrap, topic, transactional_id=f"{topic}-writer",
                                commit_timeout_ms=LOADED_MACHINE_TIMEOUT_MS)
    partition = store._partition("g")
    reader = Consumer(consumer_settings(kafka_bootstrap, f"{topic}-reader", 1_048_576))
    reader.assign([TopicPartition(topic, partition, 0)])
    try:
        written = store.append(partition, offset_commits("g", offsets(1, 1)))
        deadline = time.monotonic() + LOADED_MACHINE_TIMEOUT_MS / 1000
        visible = None
        while visible is None and time.monotonic() < deadline:  # blocking: the loop does not run meanwhile
            message = reader.poll(0.1)
            if message is not None and message.error() is None:
                visible = message
        assert visible is not None, "the write waited for the loop to start its transaction"
        await asyncio.wait_for(written, LOADED_MACHINE_TIMEOUT_MS / 1000)
    finally:
        reader.close()
        await store.close()


@pytest.mark.parametrize("writer", ["librdkafka", "native"])
async def test_start_waits_for_the_transaction_coordinator_in_bounded_attempts_and_says_so(caplog, writer: str
                                                                                           ) -> None:
    """No producer id yet (here: no cluster at all, as a transaction coordinator still loading looks to the
    client): start keeps asking in attempts, one line each, and gives up at its bound, not at the first attempt."""
    from confluent_kafka import KafkaException

    from coordinator.storage.partition_writers import transactional_producer

    producer = transactional_producer(writer, unique_topic(), {"bootstrap.servers": "127.0.0.1:1"}, "waiting",
                                      f"waiting-{uuid.uuid4().hex[:6]}", 5_000)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with caplog.at_level("INFO", logger="coordinator.storage"), pytest.raises(KafkaException):
            await producer.start(3_000, attempt_ms=1_000)
    finally:
        await producer.close(0)
    waited = loop.time() - started
    lines = [m for m in caplog.messages if "event=transactions_init_waiting producer=waiting" in m]
    assert len(lines) >= 2 and "timeout_ms=3000" in lines[0], caplog.messages
    assert 3 <= waited < 15  # its bound, with room for a loaded machine
