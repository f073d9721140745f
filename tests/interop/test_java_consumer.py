"""Apache Kafka's Java consumer (tests/support/java) shares a group with librdkafka against a real broker's own
group coordinator: the runner the relay tests will later point at our coordinator."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.java_consumer import JavaConsumer

PARTITIONS = 6
# long, so that partitions moving well within it prove the LeaveGroup, however long a loaded machine's broker
# rebalance takes
SESSION_MS = 60_000
RECORDS = 600


def _setup_topic(bootstrap: str) -> str:
    topic = f"j-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(30)
    return topic


def test_two_java_consumers_and_librdkafka_consume_a_topic_exactly_once_between_them(kafka_bootstrap: str) -> None:
    topic = _setup_topic(kafka_bootstrap)
    group = f"jg-{uuid.uuid4().hex[:8]}"
    all_partitions = {(topic, p) for p in range(PARTITIONS)}
    python_assignment: set[tuple[str, int]] = set()
    python_records: list[tuple[int, int]] = []

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        python_assignment.clear()
        python_assignment.update((tp.topic, tp.partition) for tp in partitions)

    def on_revoke(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        python_assignment.difference_update((tp.topic, tp.partition) for tp in partitions)

    python = Consumer({
        "bootstrap.servers": kafka_bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "partition.assignment.strategy": "range", "session.timeout.ms": SESSION_MS,
    })
    python.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    javas = [JavaConsumer(kafka_bootstrap, group, topic, assignor="range", session_timeout_ms=SESSION_MS,
                          client_id=f"java-{i}") for i in range(2)]
    try:
        # one stable generation of three members before any record exists, so nothing is consumed twice
        deadline = time.monotonic() + 90
        while True:
            python.poll(0.2)
            owned = [python_assignment] + [java.assignment for java in javas]
            if all(owned) and sum(map(len, owned)) == PARTITIONS and set().union(*owned) == all_partitions:
                break
            assert time.monotonic() < deadline, f"no 3-member assignment: {owned} {[j.events for j in javas]}"

        producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
        for i in range(RECORDS):
            producer.produce(topic, key=f"k{i}".encode(), partition=i % PARTITIONS)
        assert producer.flush(30) == 0

        deadline = time.monotonic() + 60
        while len(python_records) + sum(len(java.records) for java in javas) < RECORDS:
            assert time.monotonic() < deadline, "records not all consumed in 60 s"
            message = python.poll(0.2)
            if message is not None and message.error() is None:
                python_records.append((message.partition(), message.offset()))
                python.commit(message, asynchronous=False)

        consumed = python_records + [(r.partition, r.offset) for java in javas for r in java.records]
        assert len(consumed) == len(set(consumed)) == RECORDS  # exactly once between the three members
        assert {p for p, _ in python_records} <= {p for _, p in python_assignment}
        for java in javas:
            assert java.records, "each Java member got a share"
            assert {(r.topic, r.partition) for r in java.records} <= java.assignment
            java.wait_for(lambda c: all(c.committed.get(tp) == RECORDS // PARTITIONS for tp in c.assignment),
                          30, "commitSync of every consumed record")

        # closing a Java consumer sends LeaveGroup: its partitions move on long before its session expires
        leaving = javas[0]
        left_at = time.monotonic()
        assert leaving.close() == 0 and leaving.closed
        stayed = javas[1]
        while len(python_assignment) + len(stayed.assignment) < PARTITIONS:
            python.poll(0.2)
            assert time.monotonic() - left_at < SESSION_MS / 1000 * 0.75, "the closed member's partitions stayed"

        # the group's committed offsets are the end of every partition
        committed = python.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=20)
        assert {tp.partition: tp.offset for tp in committed} == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
        assert stayed.terminate() in (0, 143) and stayed.closed  # SIGTERM: the shutdown hook closed it
    finally:
        for java in javas:
            java.kill()
        python.close()
