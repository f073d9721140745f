"""TxnOffsetCommit (28) requests by hand against the coordinator (relay on) and the embedded 4.1.1 broker: the
versions advertised, each version's answers (KIP-447 checks, unknown topics, metadata too large, a refused append
mapped per version), a retried request, v5's append that adds our partition to the transaction, and bounds."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from coordinator.group.partitioner import partition_for
from coordinator.relay.config import RelayConfig
from coordinator.relay.errors import UpstreamUnavailable
from coordinator.relay.relay import Relay
from coordinator.server.context import ConnectionContext, Node
from coordinator.server.handlers import served_ranges
from coordinator.server.handlers import txn_offset_commit as txn_offset_commit_handler
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from protocol.codec import RequestHeader
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.eos_loop import stable_offset
from tests.support.group_harness import Env
from tests.support.instances import Instances
from tests.support.service import FAST, service, unique, until_loaded
from tests.support.transactions_wire import (Producer, add_partitions, batch, connect, create_topic, end_transaction,
                                             init_producer, produce, transaction_state, txn_offset_commit, wait_state)
from tests.support.wire import nested, request

import pytest

pytestmark = pytest.mark.integration

API_VERSIONS, TXN_OFFSET_COMMIT = 18, 28
STATE_PARTITIONS = 3  # tests/support/service.py's offsets.topic.num.partitions


async def until_offset(client: KafkaClient, group: str, topic: str, wanted: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (answer := await stable_offset(client, group, topic)) != (wanted, Errors.NONE):
        assert time.monotonic() < deadline, answer
        await asyncio.sleep(0.05)


async def api_range(client: KafkaClient, key: int) -> tuple[int, int]:
    answer = await client.request(request(API_VERSIONS, 3, client_software_name="t", client_software_version="1"))
    [entry] = [a for a in answer.api_keys if int(a.api_key) == key]
    return int(entry.min_version), int(entry.max_version)


async def test_txn_offset_commit_by_hand_each_version(kafka_bootstrap: str) -> None:
    state_topic, topic = unique("__state-txn"), unique("txn-in")
    create_topic(kafka_bootstrap, topic)
    async with service(kafka_bootstrap, state_topic, *FAST, relay=True) as running:
        us = await running.client()
        kafka = await connect(kafka_bootstrap)
        try:
            await until_loaded(us)
            assert await api_range(us, TXN_OFFSET_COMMIT) == await api_range(kafka, TXN_OFFSET_COMMIT) == (0, 5)
            for version in range(5):  # the TV1 requests: the relay adds our partition at AddOffsetsToTxn
                group = unique(f"txn-v{version}")
                state_partition = partition_for(group, STATE_PARTITIONS)
                producer = await init_producer(kafka, unique("app"))
                assert await add_partitions(kafka, producer, state_topic, state_partition) == 0
                offsets = {(topic, 0): 10 + version, (unique("no-such-topic"), 0): 1, (topic, 7): 3}
                answered = await txn_offset_commit(us, version, producer, group, offsets)
                assert list(answered.values()) == [Errors.NONE, Errors.UNKNOWN_TOPIC_OR_PARTITION,
                                                   Errors.UNKNOWN_TOPIC_OR_PARTITION], (version, answered)
                # the client's retry of the same request: no OUT_OF_ORDER_SEQUENCE_NUMBER, the same offsets
                assert await txn_offset_commit(us, version, producer, group, offsets) == answered
                assert await txn_offset_commit(us, version, producer, group, {(topic, 0): 1}, metadata="m" * 4097) \
                    == {(topic, 0): Errors.OFFSET_METADATA_TOO_LARGE}
                assert await stable_offset(us, group, topic) == (-1, Errors.UNSTABLE_OFFSET_COMMIT)
                assert await end_transaction(kafka, producer, commit=True, version=4) == 0
                await until_offset(us, group, topic, 10 + version)
                # until the transaction coordinator is done too (while it is completing, a late append's
                # verification answers CONCURRENT_TRANSACTIONS: retriable)
                await wait_state(kafka, producer.transactional_id, "CompleteCommit")
                # after EndTxn the leader's verification refuses a late append: per version
                late = await txn_offset_commit(us, version, producer, group, {(topic, 0): 99})
                expected = Errors.TRANSACTION_ABORTABLE if version >= 4 else Errors.INVALID_TXN_STATE
                assert late == {(topic, 0): expected}, (version, late)
                if version >= 3:  # KIP-447 refuses a generation in an unknown group, but the ended transaction
                    # is refused first, as Kafka verifies it before the group (test_txn_offset_commit_verification)
                    assert await txn_offset_commit(us, version, producer, unique("g"), {(topic, 0): 1},
                                                   generation=5, member="m") == {(topic, 0): expected}
                assert await txn_offset_commit(us, version, producer, "", {(topic, 0): 1}) == \
                    {(topic, 0): Errors.INVALID_GROUP_ID}
                assert await stable_offset(us, group, topic) == (10 + version, Errors.NONE)

            # v5 (TV2): no AddOffsetsToTxn, our append adds the state partition to the transaction itself
            group = unique("txn-v5")
            producer = await init_producer(kafka, unique("app"))
            assert await txn_offset_commit(us, 5, producer, group, {(topic, 0): 55}) == {(topic, 0): Errors.NONE}
            _, in_transaction = await transaction_state(kafka, producer.transactional_id)
            assert (state_topic, partition_for(group, STATE_PARTITIONS)) in in_transaction
            assert await end_transaction(kafka, producer, commit=True) == 0
            await wait_state(kafka, producer.transactional_id, "CompleteCommit")
            await until_offset(us, group, topic, 55)
            # TV2 bumped the epoch at EndTxn: the old epoch's late append is refused by the leader
            stale = Producer(producer.transactional_id, producer.producer_id, producer.epoch - 1)
            assert await txn_offset_commit(us, 5, stale, group, {(topic, 0): 99}) == \
                {(topic, 0): Errors.INVALID_PRODUCER_EPOCH}
            await until_offset(us, group, topic, 55)
        finally:
            await us.close()
            await kafka.close()
        assert "event=txn_offsets_committed" in running.log_text()


async def test_a_huge_txn_offset_commit_is_refused_clearly(kafka_bootstrap: str) -> None:
    """100,000 partitions of a topic the cluster lacks: each UNKNOWN_TOPIC_OR_PARTITION, in bounded time; offsets
    whose batch would pass the state topic's message size: UNKNOWN_SERVER_ERROR (Kafka's answer to a record too
    large), nothing appended, the producer's next request served."""
    state_topic, topic = unique("__state-txn"), unique("txn-wide")
    create_topic(kafka_bootstrap, topic, partitions=260)
    async with service(kafka_bootstrap, state_topic, *FAST, relay=True) as running:
        us = await running.client(timeout_ms=60_000)
        kafka = await connect(kafka_bootstrap)
        try:
            await until_loaded(us)
            group = unique("txn-wide")
            producer = await init_producer(kafka, unique("app"))
            assert await add_partitions(kafka, producer, state_topic, partition_for(group, STATE_PARTITIONS)) == 0
            missing = unique("missing")
            started = time.monotonic()
            answered = await txn_offset_commit(us, 3, producer, group, {(missing, p): 1 for p in range(100_000)},
                                               timeout_ms=60_000)
            assert len(answered) == 100_000 and set(answered.values()) == {Errors.UNKNOWN_TOPIC_OR_PARTITION}
            assert time.monotonic() - started < 30
            too_large = await txn_offset_commit(us, 3, producer, group, {(topic, p): 1 for p in range(260)},
                                                metadata="m" * 4000)
            assert set(too_large.values()) == {Errors.UNKNOWN_SERVER_ERROR}, too_large
            assert await txn_offset_commit(us, 3, producer, group, {(topic, 0): 5}) == {(topic, 0): Errors.NONE}
            assert await end_transaction(kafka, producer, commit=True, version=4) == 0
            await until_offset(us, group, topic, 5)
        finally:
            await us.close()
            await kafka.close()
        assert "event=txn_offset_commit_too_large" in running.log_text()


class AnswerLosingRelay(Relay):
    """The real relay, whose next request to a broker loses its answer: sent and answered by the broker (`after`)
    or never sent (`before`), the handler hears only that the connection failed."""

    lose: str | None = None

    async def request_to(self, node_id: int, body: Any) -> Any:
        lose, self.lose = self.lose, None
        if lose == "before":
            raise UpstreamUnavailable("the answer was lost (injected, not sent)")
        answer = await super().request_to(node_id, body)
        if lose == "after":
            raise UpstreamUnavailable("the answer was lost (injected, after the broker answered)")
        return answer


@pytest.mark.parametrize("lost", ["after", "before"])
async def test_a_retry_after_a_lost_answer_sends_the_owed_batch_first(kafka_bootstrap: str, lost: str) -> None:
    """The append's answer is lost (the batch landed, or never left): the client is answered
    COORDINATOR_NOT_AVAILABLE and retries; the retry sends the owed bytes again with their sequence (a duplicate
    if they had landed) before its own, so neither it nor the next request meets OUT_OF_ORDER_SEQUENCE_NUMBER, and
    the transaction commits the last offset."""
    state_topic, topic = unique("__state-txn"), unique("txn-in")
    create_topic(kafka_bootstrap, topic)
    store = KafkaGroupStore(StorageConfig(bootstrap=kafka_bootstrap, state_topic=state_topic,
                                          partitions=STATE_PARTITIONS, event_topic=None), load_timeout_ms=60_000)
    await store.start()
    env = Env(store=store, offsets_topic_num_partitions=STATE_PARTITIONS)
    relay = AnswerLosingRelay(RelayConfig(), kafka_bootstrap, served=served_ranges(), max_frame_bytes=100 << 20)
    kafka = await connect(kafka_bootstrap)
    try:
        await env.coordinator.load()
        await relay.start()
        ctx = ConnectionContext(node=Node(1, "127.0.0.1", 0, "test"), coordinator=env.coordinator,
                                client_host="/127.0.0.1", peer="test", relay=relay)
        group = unique("txn-lost")
        producer = await init_producer(kafka, unique("app"))
        assert await add_partitions(kafka, producer, state_topic, partition_for(group, STATE_PARTITIONS)) == 0

        async def commit(offset: int) -> Errors:
            return await _commit_by_hand(ctx, producer, group, topic, offset)

        relay.lose = lost
        assert await commit(10) == Errors.COORDINATOR_NOT_AVAILABLE
        assert await commit(10) == Errors.NONE  # the client's retry
        assert await commit(11) == Errors.NONE
        shard = env.coordinator.shard_for(group)
        # sequence 0: the owed batch (landed before, a duplicate now, or landing now), 1 and 2: each request's own
        assert shard.producer_sequences.next_sequence(producer.producer_id, producer.epoch) == 3
        assert await end_transaction(kafka, producer, commit=True, version=4) == 0
        deadline = time.monotonic() + 30
        while (current := env.coordinator.groups.get(group)) is None or current.offsets.get((topic, 0)) is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert current.offsets[(topic, 0)].offset == 11
    finally:
        await relay.close()
        await kafka.close()
        await env.close()
        await store.close()


async def test_several_instances_only_the_owner_takes_a_groups_transactional_offsets(kafka_bootstrap: str) -> None:
    """Two instances (relay on): TxnOffsetCommit to the instance that does not own the group's partition →
    NOT_COORDINATOR; the owner (its runtime behind the zombie guard) appends it, and the commit settles there."""
    topic = unique("txn-in")
    create_topic(kafka_bootstrap, topic)
    async with Instances(kafka_bootstrap, 2, relay=True) as cluster:
        ownership = await cluster.ownership()
        group = unique("txn-owned")
        partition = cluster.partition_of(group)
        [owner] = [i for i in cluster if partition in ownership.of(i.instance_id)]
        [other] = [i for i in cluster if i is not owner]
        kafka = await connect(kafka_bootstrap)
        at_owner = await KafkaClient.connect(*owner.address, client_id="t", timeout_ms=30_000)
        at_other = await KafkaClient.connect(*other.address, client_id="t", timeout_ms=30_000)
        try:
            producer = await init_producer(kafka, unique("app"))
            assert await add_partitions(kafka, producer, cluster.state_topic, partition) == 0
            assert await txn_offset_commit(at_other, 3, producer, group, {(topic, 0): 8}) == \
                {(topic, 0): Errors.NOT_COORDINATOR}
            deadline = time.monotonic() + 60
            # the owner may still be loading the partition it was just given: a client retries, so do we
            while (answered := await txn_offset_commit(at_owner, 3, producer, group, {(topic, 0): 8})) == \
                    {(topic, 0): Errors.COORDINATOR_LOAD_IN_PROGRESS}:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            assert answered == {(topic, 0): Errors.NONE}
            assert await stable_offset(at_owner, group, topic) == (-1, Errors.UNSTABLE_OFFSET_COMMIT)
            assert await end_transaction(kafka, producer, commit=True, version=4) == 0
            await until_offset(at_owner, group, topic, 8)
        finally:
            for client in (kafka, at_owner, at_other):
                await client.close()


@pytest.mark.parametrize("commit", [True, False])
async def test_a_coordinator_killed_between_txn_offset_commit_and_end_txn_loses_and_shows_nothing(
        kafka_bootstrap: str, commit: bool) -> None:
    """TxnOffsetCommit through a coordinator that is then SIGKILLed; a new one loads the partition while the
    transaction is open (pending: UNSTABLE_OFFSET_COMMIT, nothing visible early), and the transaction
    coordinator's marker settles it there: the offset on COMMIT, none on ABORT."""
    state_topic, topic, group = unique("__state-txn"), unique("txn-in"), unique("txn-kill")
    create_topic(kafka_bootstrap, topic)
    kafka = await connect(kafka_bootstrap)
    try:
        producer = await init_producer(kafka, unique("app"))
        async with service(kafka_bootstrap, state_topic, *FAST, relay=True) as first:
            us = await first.client()
            try:
                await until_loaded(us)
                assert await add_partitions(kafka, producer, state_topic, partition_for(group, STATE_PARTITIONS)) == 0
                assert await txn_offset_commit(us, 3, producer, group, {(topic, 0): 21}) == {(topic, 0): Errors.NONE}
            finally:
                await us.close()
            first.process.kill()
            await first.process.wait()
        async with service(kafka_bootstrap, state_topic, *FAST, relay=True) as second:
            us = await second.client()
            try:
                await until_loaded(us, group)
                assert await stable_offset(us, group, topic) == (-1, Errors.UNSTABLE_OFFSET_COMMIT)
                assert await end_transaction(kafka, producer, commit=commit, version=4) == 0
                deadline = time.monotonic() + 30
                while (answer := await stable_offset(us, group, topic))[1] == Errors.UNSTABLE_OFFSET_COMMIT:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                assert answer == ((21 if commit else -1), Errors.NONE)
            finally:
                await us.close()
    finally:
        await kafka.close()


async def _added(client: KafkaClient, producer: Producer, topic: str, partition: int) -> None:
    """AddPartitionsToTxn, retried while the last transaction's markers are written (bounded)."""
    deadline = time.monotonic() + 30
    while (error := await add_partitions(client, producer, topic, partition)) == Errors.CONCURRENT_TRANSACTIONS:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    assert error == 0, error


async def test_an_append_verified_beside_the_clients_own_produce_is_sent_again_not_refused(
        kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    """The client's own Produce and our append of its offsets reach the same broker at once: its
    AddPartitionsToTxnManager verifies one transactional id twice and answers the older NETWORK_EXCEPTION, which
    the Produce path reports as NOT_ENOUGH_REPLICAS. Answered to the client, that costs librdkafka a fixed 500 ms
    before it sends TxnOffsetCommit again; we send the batch again (same sequence) and answer NONE. Transactions
    run until the log shows such a retry, every TxnOffsetCommit answered NONE, the last offset committed."""
    caplog.set_level(logging.INFO, logger="coordinator.server")
    state_topic, topic, output = unique("__state-txn"), unique("txn-in"), unique("txn-out")
    create_topic(kafka_bootstrap, topic)
    create_topic(kafka_bootstrap, output)
    store = KafkaGroupStore(StorageConfig(bootstrap=kafka_bootstrap, state_topic=state_topic,
                                          partitions=STATE_PARTITIONS, event_topic=None), load_timeout_ms=60_000)
    await store.start()
    env = Env(store=store, offsets_topic_num_partitions=STATE_PARTITIONS)
    relay = Relay(RelayConfig(), kafka_bootstrap, served=served_ranges(), max_frame_bytes=100 << 20)
    kafka, own_produce = await connect(kafka_bootstrap), await connect(kafka_bootstrap)
    try:
        await env.coordinator.load()
        await relay.start()
        ctx = ConnectionContext(node=Node(1, "127.0.0.1", 0, "test"), coordinator=env.coordinator,
                                client_host="/127.0.0.1", peer="test", relay=relay)
        group = unique("txn-busy")
        producer = await init_producer(kafka, unique("app"))

        async def commit(offset: int) -> Errors:
            return await _commit_by_hand(ctx, producer, group, topic, offset)

        def retried() -> int:
            return sum(int(record.getMessage().rsplit("busy_retries=", 1)[1]) for record in caplog.records
                       if "event=txn_offsets_pending" in record.getMessage())

        transactions = 0
        while retried() == 0:
            assert transactions < 200, "no append met the client's own Produce's verification in 200 transactions"
            await _added(kafka, producer, state_topic, partition_for(group, STATE_PARTITIONS))
            await _added(kafka, producer, output, 0)
            # TV1 keeps the epoch: the output partition's sequence counts its records across transactions
            committed, produced = await asyncio.gather(
                commit(transactions + 1),
                produce(own_produce, producer, output, 0, batch(producer, transactions, (None, b"out"))))
            assert committed == Errors.NONE, (transactions, committed)
            assert produced[0] in (0, Errors.NOT_ENOUGH_REPLICAS), produced  # the client's own to retry
            if produced[0] != 0:
                assert (await produce(own_produce, producer, output, 0,
                                      batch(producer, transactions, (None, b"out"))))[0] == 0
            assert await end_transaction(kafka, producer, commit=True, version=4) == 0
            transactions += 1
        deadline = time.monotonic() + 30
        while (current := env.coordinator.groups.get(group)) is None \
                or (offset := current.offsets.get((topic, 0))) is None or offset.offset != transactions:
            assert time.monotonic() < deadline, current
            await asyncio.sleep(0.05)
    finally:
        await relay.close()
        await kafka.close()
        await own_produce.close()
        await env.close()
        await store.close()


async def _commit_by_hand(ctx: ConnectionContext, producer: Producer, group: str, topic: str, offset: int) -> Errors:
    """TxnOffsetCommit v3 of partition 0 as a generation-less producer sends it, through the handler."""
    body = request(TXN_OFFSET_COMMIT, 3, transactional_id=producer.transactional_id, group_id=group,
                   producer_id=producer.producer_id, producer_epoch=producer.epoch, generation_id=-1,
                   member_id="", group_instance_id=None, topics=(nested(TXN_OFFSET_COMMIT, 3, "topics")(
                       name=topic, partitions=(nested(TXN_OFFSET_COMMIT, 3, "topics", "partitions")(
                           partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
                           committed_metadata=""),)),))
    answer = await txn_offset_commit_handler.handle(ctx, RequestHeader(TXN_OFFSET_COMMIT, 3, 1, "t"), body)
    return Errors(int(answer.topics[0].partitions[0].error_code))
