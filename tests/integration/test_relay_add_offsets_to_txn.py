"""AddOffsetsToTxn through the relay, against a real broker: the transaction coordinator answers, and the group's
state-topic partition is in the transaction afterwards (DescribeTransactions lists it), so the coordinator's
markers will reach it. A hand-driven transaction over protocol/client.py, as a TV1 producer drives it."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from coordinator.group.partitioner import partition_for
from coordinator.group.records import OffsetCommitRecord, OffsetRecord
from coordinator.server.handlers.txn_offset_commit import (VERIFYING_PRODUCE_VERSION, ClientProducer,
                                                           append_transactional_batch, transactional_batch)
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.service import FAST, fetch_offsets, service, unique, until_loaded
from tests.support.wire import ms, request

FIND_COORDINATOR, INIT_PRODUCER_ID, ADD_OFFSETS_TO_TXN, END_TXN, DESCRIBE_TRANSACTIONS = 10, 22, 25, 26, 65
STATE_PARTITIONS = 3  # tests/support/service.py's offsets.topic.num.partitions


async def _transaction_coordinator(client: KafkaClient, transactional_id: str) -> tuple[str, int]:
    """Our listener for the transaction coordinator; the broker creates its transaction state topic on the first
    lookup (seconds for a loaded JVM): a bounded wait."""
    deadline = time.monotonic() + 120
    while True:
        found = await client.request(request(FIND_COORDINATOR, 4, key_type=1, coordinator_keys=(transactional_id,)))
        entry = found.coordinators[0]
        if entry.error_code == 0:
            return entry.host, entry.port
        assert time.monotonic() < deadline, entry
        await asyncio.sleep(0.3)


async def _init_producer(tc: KafkaClient, transactional_id: str) -> tuple[int, int]:
    deadline = time.monotonic() + 60
    while True:  # COORDINATOR_LOAD_IN_PROGRESS / CONCURRENT_TRANSACTIONS while the broker settles
        answer = await tc.request(request(INIT_PRODUCER_ID, 4, transactional_id=transactional_id,
                                          transaction_timeout=ms(60_000), producer_id=-1, producer_epoch=-1))
        if answer.error_code == 0:
            return answer.producer_id, answer.producer_epoch
        assert time.monotonic() < deadline, answer
        await asyncio.sleep(0.3)


async def _add_offsets(tc: KafkaClient, version: int, transactional_id: str, producer_id: int, epoch: int,
                       group_id: str) -> Errors:
    answer = await tc.request(request(ADD_OFFSETS_TO_TXN, version, transactional_id=transactional_id,
                                      producer_id=producer_id, producer_epoch=epoch, group_id=group_id))
    return Errors(int(answer.error_code))


async def _partitions_in_transaction(tc: KafkaClient, transactional_id: str) -> tuple[str, set[tuple[str, int]]]:
    described: Any = await tc.request(request(DESCRIBE_TRANSACTIONS, 0, transactional_ids=(transactional_id,)))
    state = described.transaction_states[0]
    assert state.error_code == 0, state
    return state.transaction_state, {(t.topic, p) for t in state.topics for p in t.partitions}


async def test_add_offsets_to_txn_adds_the_groups_state_partition_to_the_transaction(kafka_bootstrap: str) -> None:
    state_topic, group = unique("__state-txn"), unique("txn-group")
    transactional_id = unique("tx")
    async with service(kafka_bootstrap, state_topic, *FAST, relay=True) as running:
        client = await running.client()
        await until_loaded(client)
        host, port = await _transaction_coordinator(client, transactional_id)
        assert port != running.port  # a broker's listener of ours, not the bootstrap one
        tc = await KafkaClient.connect(host, port, client_id="txn-test", timeout_ms=30_000)
        try:
            producer_id, epoch = await _init_producer(tc, transactional_id)
            assert await _add_offsets(tc, 3, transactional_id, producer_id, epoch, group) == Errors.NONE
            state, partitions = await _partitions_in_transaction(tc, transactional_id)
            assert state == "Ongoing", state
            assert (state_topic, partition_for(group, STATE_PARTITIONS)) in partitions, partitions
            # only ours: Kafka's __consumer_offsets partition would be one more transaction-log append and one more
            # marker per transaction for a partition the transaction writes nothing to
            assert partitions == {(state_topic, partition_for(group, STATE_PARTITIONS))}, partitions

            # a stale epoch: the coordinator's refusal is the client's answer, per version (v0-1 knew no
            # PRODUCER_FENCED), and nothing of ours is added
            assert await _add_offsets(tc, 3, transactional_id, producer_id, epoch - 1, group) == \
                Errors.PRODUCER_FENCED
            assert await _add_offsets(tc, 1, transactional_id, producer_id, epoch - 1, group) == \
                Errors.INVALID_PRODUCER_EPOCH

            ended = await tc.request(request(END_TXN, 3, transactional_id=transactional_id,
                                             producer_id=producer_id, producer_epoch=epoch, committed=False))
            assert ended.error_code == 0, ended
            deadline = time.monotonic() + 30
            while (await _partitions_in_transaction(tc, transactional_id))[0] != "CompleteAbort":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        finally:
            await tc.close()
            await client.close()


def _offsets(group: str, topic: str, offsets: dict[int, int]) -> list[OffsetCommitRecord]:
    return [OffsetCommitRecord(group, topic, p, OffsetRecord(o, commit_timestamp_ms=int(time.time() * 1000)))
            for p, o in offsets.items()]


async def _transaction(tc: KafkaClient, leader: KafkaClient, producer: ClientProducer, state: tuple[str, int],
                       group: str, sequence: int, records: list[OffsetCommitRecord], *, commit: bool) -> None:
    """One TV1 transaction carrying `records` as a batch of the client's producer in our state partition."""
    assert await _add_offsets(tc, 3, producer.transactional_id, producer.producer_id, producer.producer_epoch,
                              group) == Errors.NONE
    appended = await append_transactional_batch(leader, producer, state[0], state[1],
                                                transactional_batch(producer, sequence, records),
                                                produce_version=VERIFYING_PRODUCE_VERSION, timeout_ms=30_000)
    assert appended.error == Errors.NONE and appended.base_offset >= 0, appended
    ended = await tc.request(request(END_TXN, 3, transactional_id=producer.transactional_id,
                                     producer_id=producer.producer_id, producer_epoch=producer.producer_epoch,
                                     committed=commit))
    assert ended.error_code == 0, ended
    wanted = "CompleteCommit" if commit else "CompleteAbort"
    deadline = time.monotonic() + 30
    while (await _partitions_in_transaction(tc, producer.transactional_id))[0] != wanted:  # markers written
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


async def test_offsets_appended_to_the_state_partition_in_a_transaction_count_only_if_it_commits(
        kafka_bootstrap: str) -> None:
    """The TV1 path by hand: AddOffsetsToTxn through the relay, our transactional append of the client's producer
    (Produce v11: the leader verifies the partition is in the transaction), EndTxn; settled by reloading the
    partition (a restarted coordinator), since the partition's tail is not part of this build yet."""
    state_topic, group, topic = unique("__state-txn"), unique("txn-group"), unique("txn-input")
    transactional_id = unique("tx")
    state = (state_topic, partition_for(group, STATE_PARTITIONS))
    host, port = kafka_bootstrap.split(",")[0].rsplit(":", 1)
    leader = await KafkaClient.connect(host, int(port), client_id="txn-test-us", timeout_ms=30_000)
    try:
        async with service(kafka_bootstrap, state_topic, *FAST, relay=True) as running:
            client = await running.client()
            await until_loaded(client)
            tc_host, tc_port = await _transaction_coordinator(client, transactional_id)
            tc = await KafkaClient.connect(tc_host, tc_port, client_id="txn-test", timeout_ms=30_000)
            try:
                producer_id, epoch = await _init_producer(tc, transactional_id)
                producer = ClientProducer(transactional_id, producer_id, epoch)
                await _transaction(tc, leader, producer, state, group, 0, _offsets(group, topic, {0: 10, 1: 20}),
                                   commit=True)
                # TV1: the next transaction keeps the epoch, the sequence continues (it counts records: 2 so far)
                await _transaction(tc, leader, producer, state, group, 2, _offsets(group, topic, {0: 99}),
                                   commit=False)
            finally:
                await tc.close()
                await client.close()
        async with service(kafka_bootstrap, state_topic, *FAST, relay=True) as restarted:
            client = await restarted.client()
            try:
                await until_loaded(client, group)
                assert await fetch_offsets(client, group, (0, 1), topic=topic) == {0: 10, 1: 20}
            finally:
                await client.close()
    finally:
        await leader.close()


async def test_add_offsets_to_txn_right_after_a_commit_waits_out_its_markers_instead_of_refusing(
        kafka_bootstrap: str) -> None:
    """A tight loop as an exactly-once application runs it: AddOffsetsToTxn the moment the last EndTxn is answered,
    while the transaction coordinator still writes that commit's markers. Kafka answers CONCURRENT_TRANSACTIONS
    then (the client backs off retry.backoff.ms, 100 ms in librdkafka); we retry it after 1 ms and answer NONE
    once the markers are written. Runs until the service's log shows such a retry (the markers' timing decides
    how soon), every answer NONE."""
    state_topic, group = unique("__state-txn"), unique("txn-group")
    transactional_id = unique("tx")
    async with service(kafka_bootstrap, state_topic, *FAST, relay=True) as running:
        client = await running.client()
        await until_loaded(client)
        tc_host, tc_port = await _transaction_coordinator(client, transactional_id)
        tc = await KafkaClient.connect(tc_host, tc_port, client_id="txn-test", timeout_ms=30_000)
        try:
            producer_id, epoch = await _init_producer(tc, transactional_id)
            answers: list[Errors] = []
            retried = 0
            while retried == 0 and len(answers) < 300:
                answers.append(await _add_offsets(tc, 3, transactional_id, producer_id, epoch, group))
                assert answers[-1] == Errors.NONE, answers
                ended = await tc.request(request(END_TXN, 3, transactional_id=transactional_id,
                                                 producer_id=producer_id, producer_epoch=epoch, committed=True))
                assert ended.error_code == 0, ended
                retried = sum(int(count) for count in re.findall(r"event=state_partition_added .*"
                                                                 r"concurrent_retries=(\d+)", running.log_text()))
            assert retried > 0, f"no AddOffsetsToTxn met a completing transaction in {len(answers)} transactions"
        finally:
            await tc.close()
            await client.close()
