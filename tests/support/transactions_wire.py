"""A transaction driven by hand over protocol/client.py, as a transactional producer drives it: the transaction
coordinator found, InitProducerId, AddPartitionsToTxn, Produce of record batches written with kio's batch writer,
TxnOffsetCommit, EndTxn, DescribeTransactions. On the single embedded broker every coordinator and leader is that broker, so one
connection per role (the application's producer, or us) is enough."""

from __future__ import annotations

import asyncio
import datetime
import io
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from coordinator.server.handlers.txn_verification import read_described_transaction
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.wire import ms, nested, request

FIND_COORDINATOR, PRODUCE, INIT_PRODUCER_ID, ADD_PARTITIONS, END_TXN, DESCRIBE_TXNS = 10, 0, 22, 24, 26, 65
TRANSACTIONAL = 0x10


@dataclass
class Producer:
    transactional_id: str
    producer_id: int
    epoch: int


async def connect(bootstrap: str) -> KafkaClient:
    host, port = bootstrap.rsplit(":", 1)
    return await KafkaClient.connect(host, int(port), timeout_ms=30_000)


def create_topic(bootstrap: str, topic: str, partitions: int = 1, timeout_s: float = 30) -> None:
    """The topic made and every partition led. The controller answers CreateTopics before the broker has applied
    the new metadata, and the broker names a partition's leader in Metadata before its replica manager has made the
    partition: a Produce sent in either window is refused with NOT_LEADER_OR_FOLLOWER (a real producer retries it;
    these hand-made requests do not). A ListOffsets answered by every partition's leader closes both windows."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic is made
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        described = admin.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
        if (described is not None and described.error is None and len(described.partitions) == partitions
                and all(p.leader >= 0 and p.error is None for p in described.partitions.values())
                and _every_partition_answers(admin, topic, partitions, timeout_s)):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"topic {topic} has no leader for every partition after {timeout_s} s: {described}")
        time.sleep(0.1)


def _every_partition_answers(admin: AdminClient, topic: str, partitions: int, timeout_s: float) -> bool:
    asked = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    try:
        for future in admin.list_offsets(asked, request_timeout=timeout_s).values():
            future.result(timeout=timeout_s)
    except KafkaException:
        return False
    return True


async def init_producer(client: KafkaClient, transactional_id: str, timeout_ms: int = 60_000) -> Producer:
    """FindCoordinator (creating __transaction_state on a fresh broker), then InitProducerId, each retried while
    the coordinator is still loading (a real producer retries the same way)."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        found = await client.request(request(FIND_COORDINATOR, 4, key_type=i8(1), coordinator_keys=(transactional_id,)))
        answer = await client.request(request(INIT_PRODUCER_ID, 5, transactional_id=transactional_id,
                                              transaction_timeout=ms(timeout_ms), producer_id=i64(-1),
                                              producer_epoch=i16(-1)))
        if found.coordinators[0].error_code == 0 and answer.error_code == 0:
            return Producer(transactional_id, int(answer.producer_id), int(answer.producer_epoch))
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"InitProducerId failed: {answer.error_code}, coordinator {found.coordinators[0]}")
        await asyncio.sleep(0.2)


def batch(producer: Producer, sequence: int, *records: tuple[bytes | None, bytes | None],
          epoch: int | None = None, transactional: bool = True) -> bytes:
    now = TZAwareMicros.parse(datetime.datetime.now(datetime.timezone.utc))
    buffer = io.BytesIO()
    write_new_batch(buffer, NewRecordBatch(
        producer_id=i64(producer.producer_id), producer_epoch=i16(producer.epoch if epoch is None else epoch),
        base_sequence=i32(sequence), attributes=i16(TRANSACTIONAL if transactional else 0),
        records=tuple(Record(attributes=i8(0), timestamp=now, offset=i64(k), key=key, value=value, headers=())
                      for k, (key, value) in enumerate(records))))
    return buffer.getvalue()


async def produce(client: KafkaClient, producer: Producer | None, topic: str, partition: int, records: bytes,
                  *, version: int = 11) -> tuple[int, int]:
    """(error code, base offset) of one Produce of `records` (acks=all), with the producer's transactional id."""
    data = nested(PRODUCE, version, "topic_data")
    partition_data = nested(PRODUCE, version, "topic_data", "partition_data")
    answer = await client.request(request(
        PRODUCE, version, transactional_id=producer.transactional_id if producer else None, acks=i16(-1),
        timeout=ms(30_000), topic_data=(data(name=topic, partition_data=(
            partition_data(index=i32(partition), records=records),)),)))
    result = answer.responses[0].partition_responses[0]
    return int(result.error_code), int(result.base_offset)


async def add_partitions(client: KafkaClient, producer: Producer, topic: str, *partitions: int) -> int:
    """AddPartitionsToTxn v3 (the client form): the error code of the first partition."""
    topic_class = nested(ADD_PARTITIONS, 3, "v3_and_below_topics")
    answer = await client.request(request(
        ADD_PARTITIONS, 3, v3_and_below_transactional_id=producer.transactional_id,
        v3_and_below_producer_id=i64(producer.producer_id), v3_and_below_producer_epoch=i16(producer.epoch),
        v3_and_below_topics=(topic_class(name=topic, partitions=tuple(i32(p) for p in partitions)),)))
    return int(answer.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)


async def end_transaction(client: KafkaClient, producer: Producer, *, commit: bool, version: int = 5) -> int:
    """EndTxn; on success the producer's epoch becomes the answered one (TV2 bumps it at every EndTxn)."""
    answer = await client.request(request(END_TXN, version, transactional_id=producer.transactional_id,
                                          producer_id=i64(producer.producer_id), producer_epoch=i16(producer.epoch),
                                          committed=commit))
    if answer.error_code == 0 and version >= 5:
        producer.epoch = int(answer.producer_epoch)
    return int(answer.error_code)


async def transaction_state(client: KafkaClient, transactional_id: str) -> tuple[str, set[tuple[str, int]]]:
    """(state, partitions in the transaction) as DescribeTransactions answers, read with the coordinator's bounded
    reader: kio's refuses the start time -1 of a transaction not begun (Empty, or just after InitProducerId)."""
    frame = await client.send(request(DESCRIBE_TXNS, 0, transactional_ids=(transactional_id,)), raw=True)
    code, described = read_described_transaction(frame)
    assert code == Errors.NONE and described is not None, code
    return described.state, set(described.partitions)


async def wait_state(client: KafkaClient, transactional_id: str, wanted: str, timeout_s: float = 30) -> None:
    """Until the transaction reaches `wanted` (its markers are written before CompleteCommit/CompleteAbort)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (state := (await transaction_state(client, transactional_id))[0]) != wanted:
        assert asyncio.get_running_loop().time() < deadline, f"transaction still {state}, not {wanted}"
        await asyncio.sleep(0.05)


async def txn_offset_commit(client: KafkaClient, version: int, producer: Producer, group: str,
                            offsets: dict[tuple[str, int], int], *, generation: int = -1, member: str = "",
                            metadata: str = "", instance: str | None = None, timeout_ms: int = 30_000
                            ) -> dict[tuple[str, int], Errors]:
    """TxnOffsetCommit at `version` by hand: each partition's error."""
    topics: dict[str, list[Any]] = {}
    partition_class = nested(ApiKey.TXN_OFFSET_COMMIT, version, "topics", "partitions")
    for (topic, partition), offset in offsets.items():
        fields = {"partition_index": partition, "committed_offset": offset, "committed_leader_epoch": -1,
                  "committed_metadata": metadata}
        topics.setdefault(topic, []).append(partition_class(**{
            name: value for name, value in fields.items() if name in partition_class.__dataclass_fields__}))
    topic_class = nested(ApiKey.TXN_OFFSET_COMMIT, version, "topics")
    answer = await client.request(request(
        ApiKey.TXN_OFFSET_COMMIT, version, transactional_id=producer.transactional_id, group_id=group,
        producer_id=producer.producer_id, producer_epoch=producer.epoch, generation_id=generation,
        member_id=member, group_instance_id=instance,
        topics=tuple(topic_class(name=name, partitions=tuple(parts)) for name, parts in topics.items())),
        timeout_ms=timeout_ms)
    return {(t.name, int(p.partition_index)): Errors(int(p.error_code)) for t in answer.topics for p in t.partitions}
