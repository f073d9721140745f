"""KIP-447 with static membership (KIP-345) through the coordinator and against Kafka 4.1.1 itself: a
transactional producer sending offsets with the group metadata of a static member whose group.instance.id has
since been taken by a new consumer (its member id replaced) is refused
FENCED_INSTANCE_ID, at every TxnOffsetCommit version that carries the instance id (v3-5, by hand); the new
member's metadata commits. confluent-kafka's consumers and transactional producer, the same figures asserted both
ways."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support.eos_loop import (group_offset, loaded_coordinator, produce_input, read_committed_consumer,
                                    transactional_producer)
from tests.support.service import unique
from tests.support.transactions_wire import create_topic, end_transaction, init_producer, txn_offset_commit
from tests.support.wire import request

pytestmark = pytest.mark.integration


def _static_member(bootstrap: str, group: str, instance_id: str, source: str) -> Consumer:
    consumer = read_committed_consumer(bootstrap, group, **{"group.instance.id": instance_id})
    consumer.subscribe([source])
    deadline = time.monotonic() + 60
    while not consumer.assignment():
        assert time.monotonic() < deadline, "the static member never got its assignment"
        consumer.poll(0.2)
    return consumer


def _send_offsets(bootstrap: str, source: str, sink: str, metadata: object, offset: int) -> str:
    """One transaction with `metadata`'s offsets; the error name its send_offsets_to_transaction raised, or
    NONE once committed."""
    producer = transactional_producer(bootstrap, unique("eos-static-app"))
    try:
        producer.begin_transaction()
        producer.produce(sink, value=b"out", partition=0)
        try:
            producer.send_offsets_to_transaction([TopicPartition(source, 0, offset)], metadata, 60)
        except KafkaException as exc:
            producer.abort_transaction(60)
            return str(exc.args[0].name())
        producer.commit_transaction(60)
        return "NONE"
    finally:
        producer.flush(10)


async def _by_hand(bootstrap: str, group: str, source: str, instance: str, member: str) -> list[str]:
    """TxnOffsetCommit v3-5 (the versions carrying group.instance.id) with `instance` and a member id it no
    longer has, each in a transaction of its own as a client drives it (v3 and v4 after AddOffsetsToTxn to the
    transaction coordinator, broker 1; v5, transaction version 2, without): every version's answer."""
    host, port = bootstrap.rsplit(":", 1)
    client = await KafkaClient.connect(host, int(port), client_id="eos-static", timeout_ms=30_000)
    metadata = await client.request(request(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                            include_topic_authorized_operations=False))
    [coordinator] = [(b.host, int(b.port)) for b in metadata.brokers if int(b.node_id) == 1]
    transactions = await KafkaClient.connect(*coordinator, client_id="eos-static", timeout_ms=30_000)
    try:
        answers = []
        for version in (3, 4, 5):
            producer = await init_producer(transactions, unique("eos-static-hand"))
            if version < 5:
                added = await transactions.request(request(
                    ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id=producer.transactional_id,
                    producer_id=producer.producer_id, producer_epoch=producer.epoch, group_id=group))
                assert int(added.error_code) == 0, added
            [error] = (await txn_offset_commit(client, version, producer, group, {(source, 0): 5}, generation=1,
                                               member=member, instance=instance)).values()
            answers.append(f"v{version}:{error.name}")
            await end_transaction(transactions, producer, commit=False, version=4)
        return answers
    finally:
        await client.close()
        await transactions.close()


def fenced_static_member(bootstrap: str, kafka: str) -> tuple[str, str, int, list[str]]:
    """(the replaced member's error, the new member's error, the group's offset, each version's answer to the
    replaced member id by hand)."""
    group, source, sink, instance = unique("eos-static"), unique("eos-in"), unique("eos-out"), unique("static")
    create_topic(kafka, source)
    create_topic(kafka, sink)
    produce_input(kafka, source)
    first = _static_member(bootstrap, group, instance, source)
    stale = first.consumer_group_metadata()
    second = _static_member(bootstrap, group, instance, source)  # same group.instance.id: a new member id
    try:
        replaced = _send_offsets(bootstrap, source, sink, stale, 3)
        current = _send_offsets(bootstrap, source, sink, second.consumer_group_metadata(), 7)
        by_hand = asyncio.run(_by_hand(bootstrap, group, source, instance, first.memberid()))
    finally:
        second.close()
        first.close()
    return replaced, current, group_offset(bootstrap, group, source), by_hand


async def test_a_replaced_static_member_is_fenced_as_by_kafka(kafka_bootstrap: str) -> None:
    async with loaded_coordinator(kafka_bootstrap) as running:
        ours = await asyncio.to_thread(fenced_static_member, f"127.0.0.1:{running.port}", kafka_bootstrap)
        log_text = running.log_text()
    theirs = await asyncio.to_thread(fenced_static_member, kafka_bootstrap, kafka_bootstrap)
    fenced = [f"v{version}:FENCED_INSTANCE_ID" for version in (3, 4, 5)]
    assert theirs == ("FENCED_INSTANCE_ID", "NONE", 7, fenced), theirs
    assert ours == theirs
    refused = [line for line in log_text.splitlines() if "event=txn_offset_commit_refused" in line]
    assert [line.rsplit("error=", 1)[1] for line in refused] == ["FENCED_INSTANCE_ID"] * 4, refused
    assert [line.split(" version=", 1)[1].split()[0] for line in refused] == ["3", "3", "4", "5"], refused
