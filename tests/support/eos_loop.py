"""An exactly-once consume-transform-produce loop of confluent-kafka clients (`send_offsets_to_transaction`), and
what it leaves: run through us or against Kafka itself, the figures compared by the tests."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.service import FAST, Service, service, unique, until_loaded
from tests.support.transactions_wire import create_topic
from tests.support.wire import nested, request

RECORDS = 40
PER_TRANSACTION = 5
ABORTED_TRANSACTION = 3  # the fourth transaction (records 15-19) is aborted once, then done again


@dataclass(frozen=True)
class LoopFigures:
    committed_output: list[str]  # the output topic read_committed, in order
    uncommitted_output: int  # records in the output topic read_uncommitted (the aborted ones included)
    group_offset: int  # the group's committed offset of the input partition


def produce_input(kafka: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kafka})
    for index in range(RECORDS):
        producer.produce(topic, value=str(index).encode(), partition=0)
    assert producer.flush(30) == 0


def read_committed_consumer(bootstrap: str, group: str, **settings: object) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                     "session.timeout.ms": 10_000, **settings})


def transactional_producer(bootstrap: str, transactional_id: str, **settings: object) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **settings})
    producer.init_transactions(60)
    return producer


def take(consumer: Consumer, count: int, deadline_s: float = 60) -> list[object]:
    taken: list[object] = []
    deadline = time.monotonic() + deadline_s
    while len(taken) < count:
        assert time.monotonic() < deadline, f"only {len(taken)} of {count} records consumed"
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            taken.append(message)
    return taken


def read_all(kafka: str, topic: str, isolation: str, expected_at_least: int) -> list[str]:
    reader = Consumer({"bootstrap.servers": kafka, "group.id": unique("reader"), "enable.auto.commit": False,
                       "auto.offset.reset": "earliest", "isolation.level": isolation})
    reader.assign([TopicPartition(topic, 0, 0)])
    values: list[str] = []
    try:
        deadline = time.monotonic() + 30
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and (len(values) < expected_at_least or time.monotonic() - quiet_since < 1):
            message = reader.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value().decode())
                quiet_since = time.monotonic()
    finally:
        reader.close()
    return values


def consume_transform_produce(bootstrap: str, kafka: str, group: str) -> LoopFigures:
    """RECORDS input records in transactions of PER_TRANSACTION, output `out-<value>`; transaction
    ABORTED_TRANSACTION is aborted once (its output `aborted-<value>`), the consumer rewound and the records done
    again. `bootstrap` is where the clients go (us or Kafka), `kafka` the cluster the topics live on."""
    source, sink = unique("eos-in"), unique("eos-out")
    create_topic(kafka, source)
    create_topic(kafka, sink)
    produce_input(kafka, source)
    consumer = read_committed_consumer(bootstrap, group)
    producer = transactional_producer(bootstrap, unique("eos-app"))
    try:
        consumer.assign([TopicPartition(source, 0)])
        done, aborted_once = 0, False
        while done < RECORDS:
            batch = take(consumer, PER_TRANSACTION)
            first = batch[0].offset()  # type: ignore[attr-defined]
            abort = done // PER_TRANSACTION == ABORTED_TRANSACTION and not aborted_once
            producer.begin_transaction()
            for message in batch:
                value = message.value().decode()  # type: ignore[attr-defined]
                producer.produce(sink, value=f"{'aborted' if abort else 'out'}-{value}".encode(), partition=0)
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 60)
            if abort:
                producer.flush(60)  # the aborted records in the log (abort_transaction purges what is unsent)
                producer.abort_transaction(60)
                aborted_once = True
                consumer.seek(TopicPartition(source, 0, first))
                continue
            producer.commit_transaction(60)
            done += len(batch)
    finally:
        consumer.close()
        producer.flush(10)
    committed_output = read_all(kafka, sink, "read_committed", RECORDS)
    uncommitted = read_all(kafka, sink, "read_uncommitted", RECORDS + PER_TRANSACTION)
    return LoopFigures(committed_output, len(uncommitted), group_offset(bootstrap, group, source))


def group_offset(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset as a read_committed consumer asks it (OffsetFetch with require_stable)."""
    reader = read_committed_consumer(bootstrap, group)
    try:
        [committed] = reader.committed([TopicPartition(topic, 0)], timeout=60)
        return committed.offset
    finally:
        reader.close()


@dataclass
class OpenTransaction:
    """A consume-transform-produce transaction left open after `send_offsets_to_transaction`: its output
    produced and flushed, its offsets pending in the coordinator; `producer` ends it."""

    consumer: Consumer
    producer: Producer
    transactional_id: str
    source: str
    sink: str
    offset: int  # the offset sent to the transaction

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(10)


def open_transaction(bootstrap: str, kafka: str, group: str, **producer_settings: object) -> OpenTransaction:
    """PER_TRANSACTION input records consumed (an assigned read_committed consumer of `group`) and transformed in
    one transaction of a transactional producer, both through `bootstrap`; the offsets sent, the transaction
    open."""
    source, sink = unique("eos-in"), unique("eos-out")
    create_topic(kafka, source)
    create_topic(kafka, sink)
    produce_input(kafka, source)
    consumer = read_committed_consumer(bootstrap, group)
    transactional_id = unique("eos-app")
    producer = transactional_producer(bootstrap, transactional_id, **producer_settings)
    consumer.assign([TopicPartition(source, 0)])
    batch = take(consumer, PER_TRANSACTION)
    producer.begin_transaction()
    for message in batch:
        producer.produce(sink, value=f"out-{message.value().decode()}".encode(), partition=0)  # type: ignore
    producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                         consumer.consumer_group_metadata(), 60)
    assert producer.flush(60) == 0
    return OpenTransaction(consumer, producer, transactional_id, source, sink,
                           batch[-1].offset() + 1)  # type: ignore[attr-defined]


async def stable_offset(client: KafkaClient, group: str, topic: str) -> tuple[int, Errors]:
    """OffsetFetch v7 with require_stable of `topic`'s partition 0: (offset, the partition's error, or the
    request's when the group is not served there)."""
    entry = nested(ApiKey.OFFSET_FETCH, 7, "topics")(name=topic, partition_indexes=(0,))
    answer = await client.request(request(ApiKey.OFFSET_FETCH, 7, group_id=group, topics=(entry,),
                                          require_stable=True))
    if answer.error_code != Errors.NONE:  # NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS
        return -1, Errors(int(answer.error_code))
    [partition] = answer.topics[0].partitions
    return int(partition.committed_offset), Errors(int(partition.error_code))


@asynccontextmanager
async def loaded_coordinator(kafka: str, *, extra_env: dict[str, str] | None = None) -> AsyncIterator[Service]:
    """`coordinator serve` with the relay on a fresh state topic (`extra_env` in its environment), once it has
    loaded its partitions."""
    async with service(kafka, unique("__state-eos"), *FAST, relay=True, extra_env=extra_env) as running:
        client = await running.client()
        try:
            await until_loaded(client)
        finally:
            await client.close()
        yield running
