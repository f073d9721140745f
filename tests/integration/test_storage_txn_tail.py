"""Client transactions on a served state partition settled by its tail (coordinator/storage/txn_tail.py) against the
embedded broker: a client's transactional offsets become current when the transaction coordinator's COMMIT
marker is read, without any reload, and are dropped on ABORT; a restart between the offsets and the marker
loads them pending (UNSTABLE_OFFSET_COMMIT with require_stable) and the marker then decides them; the later
record wins between a regular commit and a transactional one; a partition moved to another instance is settled
there; the tail reads again from the log start when out of range and survives its broker restarting.

The client is mostly a confluent-kafka transactional producer writing offset commit records into our partition
itself: the same bytes, producer fields and markers a TxnOffsetCommit leaves there, without the relay; one test
drives the TxnOffsetCommit path by hand (our Produce of the client's batch, on a TV1 and the default broker)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from coordinator.embedded import EmbeddedKafka
from coordinator.group.api import (OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
                                   OffsetDeleteRequest, OffsetDeleteRequestTopic, OffsetFetchRequest,
                                   OffsetFetchRequestTopic)
from coordinator.group.partitioner import partition_for
from coordinator.group.records import OffsetCommitRecord, OffsetRecord
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.storage.txn_tail import TransactionTails
from coordinator.group.txn_offsets import (ClientTransactionalBatch, EndTransactionMarker, OwnOffsetTombstone,
                                           TransactionEvent, replay_transactional_offsets)
from coordinator.storage.records import OffsetCommitKey, encode, encode_key, encode_offset_commit_value
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.group_harness import Env
from tests.support.kafka_store import unique_topic
from tests.support.transactions_wire import (Producer as TxnProducer, add_partitions, batch, connect, end_transaction,
                                             init_producer, produce)

pytestmark = pytest.mark.integration

PARTITIONS = 2


async def served(bootstrap: str, topic: str, *, transactional_id: str | None = None, partition_fencing: bool = False,
                 partitions: list[int] | None = None) -> Env:
    store = KafkaGroupStore(StorageConfig(bootstrap=bootstrap, state_topic=topic, partitions=PARTITIONS,
                                          event_topic=None, transactional_id=transactional_id,
                                          partition_fencing=partition_fencing), load_timeout_ms=60_000)
    await store.start()
    env = Env(store=store, offsets_topic_num_partitions=PARTITIONS)
    await env.coordinator.load(partitions)
    return env


async def close(env: Env) -> None:
    await env.close()
    await env.store.close()


async def client_transaction(bootstrap: str, topic: str, group: str, offset: int) -> Producer:
    """A client's transaction holding one offset commit of `group` for orders-0 in the group's partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"app-{uuid.uuid4().hex}"})
    await asyncio.to_thread(producer.init_transactions, 30)
    producer.begin_transaction()
    producer.produce(topic, key=encode_key(OffsetCommitKey(group, "orders", 0)),
                     value=encode_offset_commit_value(OffsetRecord(offset, commit_timestamp_ms=offset)),
                     partition=partition_for(group, PARTITIONS))
    await asyncio.to_thread(producer.flush, 30)
    return producer


async def fetch(env: Env, group: str, *, require_stable: bool) -> tuple[int, Errors]:
    response = await env.coordinator.fetch_offsets(OffsetFetchRequest(
        group, [OffsetFetchRequestTopic("orders", [0])], require_stable=require_stable))
    [answer] = response.topics[0].partitions
    return answer.committed_offset, Errors(answer.error_code)


async def until(condition: Callable[[], object], timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)


async def fetched_is(env: Env, group: str, wanted: tuple[int, Errors], timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while (got := await fetch(env, group, require_stable=True)) != wanted:
            await asyncio.sleep(0.05)
    assert got == wanted


async def commit(env: Env, group: str, offset: int) -> None:
    response = await env.coordinator.commit_offsets(OffsetCommitRequest(group, -1, "", [OffsetCommitRequestTopic(
        "orders", [OffsetCommitRequestPartition(0, offset, -1, "")])]))
    assert response.topics[0].partitions[0].error_code == Errors.NONE


async def test_commit_makes_the_offset_current_and_abort_drops_it_while_served(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    env = await served(kafka_bootstrap, topic)
    try:
        committing = await client_transaction(kafka_bootstrap, topic, "committed", 40)
        aborting = await client_transaction(kafka_bootstrap, topic, "aborted", 50)
        await fetched_is(env, "committed", (-1, Errors.UNSTABLE_OFFSET_COMMIT))  # read by the tail: pending
        await fetched_is(env, "aborted", (-1, Errors.UNSTABLE_OFFSET_COMMIT))
        assert await fetch(env, "committed", require_stable=False) == (-1, Errors.NONE)

        await asyncio.to_thread(committing.commit_transaction, 30)
        await asyncio.to_thread(aborting.abort_transaction, 30)
        await fetched_is(env, "committed", (40, Errors.NONE))
        await fetched_is(env, "aborted", (-1, Errors.NONE))
        shard = env.coordinator.shard_for("committed")
        assert shard.groups["committed"].offsets[("orders", 0)].log_offset is not None
        assert not shard.transactional_offsets.by_producer
    finally:
        await close(env)


async def test_a_restart_between_the_offsets_and_the_marker_loads_them_pending(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    env = await served(kafka_bootstrap, topic)
    producer = await client_transaction(kafka_bootstrap, topic, "g", 7)
    await fetched_is(env, "g", (-1, Errors.UNSTABLE_OFFSET_COMMIT))
    await close(env)  # the coordinator goes away before the client ends its transaction

    env = await served(kafka_bootstrap, topic)
    try:
        shard = env.coordinator.shard_for("g")
        assert await fetch(env, "g", require_stable=True) == (-1, Errors.UNSTABLE_OFFSET_COMMIT)  # from the load
        assert shard.transactional_offsets.read_to > 0
        await asyncio.to_thread(producer.commit_transaction, 30)
        await fetched_is(env, "g", (7, Errors.NONE))
    finally:
        await close(env)


async def test_a_regular_commit_after_the_transactional_one_wins(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    env = await served(kafka_bootstrap, topic, transactional_id=f"{topic}-coordinator")
    try:
        producer = await client_transaction(kafka_bootstrap, topic, "g", 10)
        await fetched_is(env, "g", (-1, Errors.UNSTABLE_OFFSET_COMMIT))
        await commit(env, "g", 20)  # written by our transactional writer, after the client's record
        await asyncio.to_thread(producer.commit_transaction, 30)
        shard = env.coordinator.shard_for("g")
        await until(lambda: not shard.transactional_offsets.by_producer)
        assert await fetch(env, "g", require_stable=True) == (20, Errors.NONE)
        tails = env.store._tails
        assert tails is not None and tails.owners.ours  # our writer's batch was named ours, never made pending
        assert shard.groups["g"].offsets[("orders", 0)].log_offset is not None  # from the delivery report
    finally:
        await close(env)


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent-writer", "transactional-writer"])
async def test_a_transactional_commit_after_a_regular_one_wins_on_commit(kafka_bootstrap: str,
                                                                          transactional: bool) -> None:
    """Kafka keeps the later record, not the larger offset: the client's 10, written after our 20, is current."""
    topic = unique_topic()
    env = await served(kafka_bootstrap, topic, transactional_id=f"{topic}-coordinator" if transactional else None)
    try:
        await commit(env, "g", 20)
        shard = env.coordinator.shard_for("g")
        regular = shard.groups["g"].offsets[("orders", 0)]
        assert regular.log_offset is not None  # the record's offset, reported by the append
        producer = await client_transaction(kafka_bootstrap, topic, "g", 10)
        await fetched_is(env, "g", (-1, Errors.UNSTABLE_OFFSET_COMMIT))
        await asyncio.to_thread(producer.commit_transaction, 30)
        await fetched_is(env, "g", (10, Errors.NONE))
        assert shard.groups["g"].offsets[("orders", 0)].log_offset > regular.log_offset
    finally:
        await close(env)


async def test_an_idle_tail_sends_no_fetch_while_nothing_is_written_and_still_reads_a_transaction_at_once(
        kafka_bootstrap: str) -> None:
    """Served partitions with nothing written: once each tail's catch-up fetch found nothing, its tail waits in
    one long poll, so no Fetch at all is sent over a window of seconds (the short polls sent 4 a second per
    partition); a client's batch and its COMMIT marker written meanwhile are read at once, well within the idle
    wait, without anyone telling the tail."""
    topic = unique_topic()
    env = await served(kafka_bootstrap, topic)
    tails = env.store._tails
    assert tails is not None and tails.idle_wait_ms >= 30_000
    try:
        await until(lambda: tails.fetches >= 2 * PARTITIONS)  # each: the catch-up fetch, then its long poll
        before = tails.fetches
        await asyncio.sleep(_IDLE_WINDOW_S)  # the window the requests are counted over
        assert tails.fetches == before

        producer = await client_transaction(kafka_bootstrap, topic, "g", 8)
        await fetched_is(env, "g", (-1, Errors.UNSTABLE_OFFSET_COMMIT), timeout_s=10)
        await asyncio.to_thread(producer.commit_transaction, 30)
        await fetched_is(env, "g", (8, Errors.NONE), timeout_s=10)
    finally:
        await close(env)


_IDLE_WINDOW_S = 3


@pytest.mark.parametrize("fencing", [False, True], ids=["idempotent", "transactional"])
async def test_the_tail_reads_our_offset_tombstones_after_a_clients_batch_in_log_order(kafka_bootstrap: str,
                                                                                      fencing: bool) -> None:
    """Our OffsetDelete's tombstone lands between a client's batch and its COMMIT: a tail reading the partition
    from its start hands over the batch, our tombstone where it is (a transactional writer's at our COMMIT
    marker: it takes effect there) and the COMMIT, in log order, whatever the tombstone's acknowledgement said;
    the served shard makes nothing current.

    A transactional writer's OffsetDelete is answered once EndTxn is, and Kafka's transaction coordinator answers
    EndTxn before it writes the markers: a client's COMMIT sent after that answer can still land before our COMMIT
    marker (seen under load: client batch, client COMMIT, our COMMIT). So the client commits only once a tail has
    read our tombstone's COMMIT marker (`landed`)."""
    topic = unique_topic()
    prefix = f"coordinator-{uuid.uuid4().hex}"
    env = await served(kafka_bootstrap, topic, transactional_id=prefix if fencing else None,
                       partition_fencing=fencing)
    partition = partition_for("g", PARTITIONS)

    def ours(transactional_id: str) -> bool:
        return transactional_id.startswith(prefix)
    tails = TransactionTails(kafka_bootstrap, None, topic, ours, max_wait_ms=200)
    landing = TransactionTails(kafka_bootstrap, None, topic, ours, max_wait_ms=50)
    seen: list[TransactionEvent] = []
    landed: list[TransactionEvent] = []
    try:
        producer = await client_transaction(kafka_bootstrap, topic, "g", 30)
        await fetched_is(env, "g", (-1, Errors.UNSTABLE_OFFSET_COMMIT))  # the served tail has read the batch
        landing.follow(partition, 0, lambda events, _read_to: landed.extend(events))
        response = await env.coordinator.delete_offsets(OffsetDeleteRequest("g", [OffsetDeleteRequestTopic(
            "orders", [0])]))
        assert response.error_code == Errors.NONE
        await until(lambda: any(isinstance(event, OwnOffsetTombstone) for event in landed))
        await asyncio.to_thread(producer.commit_transaction, 30)
        tails.follow(partition, 0, lambda events, _read_to: seen.extend(events))
        await until(lambda: any(isinstance(event, EndTransactionMarker) for event in seen))
        await fetched_is(env, "g", (-1, Errors.NONE))
    finally:
        await landing.close()
        await tails.close()
        await close(env)
    client, tombstone, marker = seen
    assert isinstance(client, ClientTransactionalBatch) and isinstance(marker, EndTransactionMarker) and marker.commit
    assert isinstance(tombstone, OwnOffsetTombstone)
    assert (tombstone.group_id, tombstone.tp) == ("g", ("orders", 0)) and client.last_offset < tombstone.offset
    assert tombstone.settled_at > tombstone.offset if fencing else tombstone.settled_at == tombstone.offset
    assert tombstone.settled_at < marker.offset


@pytest.mark.parametrize("cluster", ["kafka_bootstrap", "kafka_tv1"])
async def test_a_hand_driven_transaction_appended_by_us_is_settled_by_its_markers(
        request: pytest.FixtureRequest, cluster: str) -> None:
    """The TxnOffsetCommit path by hand (TV1 requests, on a TV1 and the default TV2 broker): the state partition
    added to the client's transaction, the client's batch appended with our Produce and replayed at its answer as
    the handler does, a retry of it recognised as the duplicate it is; the tail reads it back without applying it
    twice and settles it with the marker; the next transaction of the same producer aborts and changes nothing."""
    bootstrap = request.getfixturevalue(cluster)
    topic = unique_topic()
    env = await served(bootstrap, topic)
    app, us = await connect(bootstrap), await connect(bootstrap)
    try:
        partition = partition_for("g", PARTITIONS)
        shard = env.coordinator.shard_for("g")
        producer = await init_producer(app, f"app-{uuid.uuid4().hex}")
        sequence = 0
        for offset, outcome in ((40, True), (50, False)):
            assert await added(app, producer, topic, partition) == 0  # the relay, at AddOffsetsToTxn
            record = OffsetCommitRecord("g", "orders", 0, OffsetRecord(offset, commit_timestamp_ms=offset))
            data = batch(producer, sequence, encode(record))
            error, base = await produce(us, producer, topic, partition, data)
            assert error == 0
            replay_transactional_offsets(shard, producer.producer_id, producer.epoch, [(base, record)])
            assert await produce(us, producer, topic, partition, data) == (0, base)  # a retry: the duplicate
            replay_transactional_offsets(shard, producer.producer_id, producer.epoch, [(base, record)])
            await until(lambda: shard.transactional_offsets.read_to > base)  # the tail has read it back
            [pending] = shard.transactional_offsets.by_producer[producer.producer_id].offsets["g"].values()
            assert pending.record.log_offset == base
            assert shard.producer_sequences.next_sequence(producer.producer_id, producer.epoch) == sequence + 1
            assert await fetch(env, "g", require_stable=True) == (-1, Errors.UNSTABLE_OFFSET_COMMIT)
            assert await end_transaction(app, producer, commit=outcome, version=4) == 0
            await until(lambda: not shard.transactional_offsets.by_producer)
            assert await fetch(env, "g", require_stable=True) == (40, Errors.NONE)
            sequence += 1  # TV1: the same epoch, the sequence goes on after the marker
    finally:
        await app.close()
        await us.close()
        await close(env)


async def added(app: KafkaClient, producer: TxnProducer, topic: str, partition: int) -> int:
    """AddPartitionsToTxn retried while the producer's last transaction completes, as clients retry it: the
    marker in our partition (which the tail reads at once) comes before the transaction coordinator is done,
    CONCURRENT_TRANSACTIONS meanwhile."""
    async with asyncio.timeout(30):
        while (error := await add_partitions(app, producer, topic, partition)) == Errors.CONCURRENT_TRANSACTIONS:
            await asyncio.sleep(0.02)
    return error


async def test_a_partition_moved_to_another_instance_is_settled_there_and_no_longer_followed_here(
        kafka_bootstrap: str) -> None:
    topic = unique_topic()
    partition = partition_for("g", PARTITIONS)
    first = await served(kafka_bootstrap, topic, transactional_id=f"{topic}-coordinator", partition_fencing=True)
    second: Env | None = None
    try:
        producer = await client_transaction(kafka_bootstrap, topic, "g", 12)
        await fetched_is(first, "g", (-1, Errors.UNSTABLE_OFFSET_COMMIT))
        await first.coordinator.unload([partition])  # revoked: another instance takes it
        tails = first.store._tails
        assert tails is not None and partition not in tails.followed

        second = await served(kafka_bootstrap, topic, transactional_id=f"{topic}-coordinator",
                              partition_fencing=True, partitions=[partition])
        assert await fetch(second, "g", require_stable=True) == (-1, Errors.UNSTABLE_OFFSET_COMMIT)
        await asyncio.to_thread(producer.commit_transaction, 30)
        await fetched_is(second, "g", (12, Errors.NONE))
        assert not first.coordinator.shard_for("g").transactional_offsets.by_producer  # nothing delivered there
    finally:
        await close(first)
        if second is not None:
            await close(second)


async def test_a_tail_out_of_range_reads_again_from_the_log_start(kafka_bootstrap: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    topic = unique_topic()
    env = await served(kafka_bootstrap, topic)  # creates the topic
    await close(env)
    partition = partition_for("g", PARTITIONS)
    producer = await client_transaction(kafka_bootstrap, topic, "g", 3)
    await asyncio.to_thread(producer.commit_transaction, 30)
    tails = TransactionTails(kafka_bootstrap, None, topic, lambda _id: False, max_wait_ms=200)
    seen: list[TransactionEvent] = []
    try:
        tails.follow(partition, 1_000_000, lambda events, _read_to: seen.extend(events))
        await until(lambda: len(seen) == 2)
    finally:
        await tails.close()
    batch, marker = seen
    assert isinstance(batch, ClientTransactionalBatch) and isinstance(marker, EndTransactionMarker)
    assert [r.value.offset for _, r in batch.offset_commits if r.value] == [3] and marker.commit
    assert "event=txn_tail_restart" in caplog.text and "reason=offset_out_of_range from_offset=0" in caplog.text


async def test_the_tail_survives_its_broker_restarting(restartable_kafka: EmbeddedKafka,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    topic = unique_topic()
    bootstrap = restartable_kafka.bootstrap
    env = await served(bootstrap, topic)
    try:
        producer = await client_transaction(bootstrap, topic, "g", 21)
        await fetched_is(env, "g", (-1, Errors.UNSTABLE_OFFSET_COMMIT))
        await restartable_kafka.stop()
        await restartable_kafka.start()
        await asyncio.to_thread(producer.commit_transaction, 60)
        await fetched_is(env, "g", (21, Errors.NONE), timeout_s=60)
        assert "event=txn_tail_restart" in caplog.text  # the connection was lost and made again
    finally:
        await close(env)
