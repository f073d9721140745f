"""An exactly-once consume-transform-produce loop of confluent-kafka clients (`send_offsets_to_transaction`), and
what it leaves: run through us or against Kafka itself, the figures compared by the tests."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.service import unique
from tests.support.transactions_wire import create_topic

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
