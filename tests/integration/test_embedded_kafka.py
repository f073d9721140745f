"""The broker the tests run against is a real Apache Kafka: these fail against anything less."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from coordinator.embedded import BrokerStartError, EmbeddedKafka, process_alive


def _topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _create(bootstrap: str, topic: str, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, config=config or {})])
    futures[topic].result(timeout=30)


def _produce_confluent(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for i, value in enumerate(values):
        producer.produce(topic, key=str(i).encode(), value=value)
    assert producer.flush(30) == 0


def _consume_confluent(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < expected and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    return got


def _high_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw-probe"})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    consumer.close()
    return high


def test_confluent_kafka_produce_consume(kafka_bootstrap: str) -> None:
    topic = _topic()
    _create(kafka_bootstrap, topic)
    values = [f"record-{i}".encode() for i in range(50)]
    _produce_confluent(kafka_bootstrap, topic, values)
    assert _consume_confluent(kafka_bootstrap, topic, len(values)) == values
    assert _high_watermark(kafka_bootstrap, topic) == len(values)


async def test_aiokafka_idempotent_produce_consume(kafka_bootstrap: str) -> None:
    topic = _topic()
    _create(kafka_bootstrap, topic)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        for i in range(20):
            await producer.send_and_wait(topic, f"aio-{i}".encode(), key=str(i).encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        batches = await consumer.getmany(timeout_ms=10_000, max_records=20)
        values = [record.value for records in batches.values() for record in records]
        while len(values) < 20:
            more = await consumer.getmany(timeout_ms=5_000, max_records=20)
            if not more:
                break
            values += [record.value for records in more.values() for record in records]
    finally:
        await consumer.stop()
    assert values == [f"aio-{i}".encode() for i in range(20)]
    assert _high_watermark(kafka_bootstrap, topic) == 20


def test_compacted_topic_config_reads_back(kafka_bootstrap: str) -> None:
    topic = _topic()
    _create(kafka_bootstrap, topic, {"cleanup.policy": "compact", "segment.ms": "60000"})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["segment.ms"].value == "60000"
    assert not configs["cleanup.policy"].is_default


async def test_async_context_manager_starts_and_stops_the_jvm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with EmbeddedKafka(tmp_path / "kafka") as broker:
        pid = broker.pid
        assert pid is not None and process_alive(pid)
        assert (tmp_path / "kafka" / "logs" / "meta.properties").exists()
    assert not process_alive(pid)


def test_broker_dies_with_the_process_that_started_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """No orphan JVM even when the parent is SIGKILLed and gets no chance to clean up."""
    script = textwrap.dedent(f"""
        import sys
        from coordinator.embedded import BrokerStartError, EmbeddedKafka, process_alive
        broker = EmbeddedKafka({str(tmp_path / 'kafka')!r})
        broker.start_blocking()
        print(broker.pid, flush=True)
        sys.stdin.read()
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                              text=True)
    try:
        jvm_pid = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert process_alive(jvm_pid)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 60  # a loaded machine's JVM may take a while to notice and exit; bounded
    while process_alive(jvm_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not process_alive(jvm_pid), f"broker JVM {jvm_pid} outlived its parent"



def test_cli_kafka_prints_bootstrap_and_stops_on_sigint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    process = subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "kafka", "--data-dir", str(tmp_path / "k")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        banner = process.stdout.readline()  # type: ignore[union-attr]
        bootstrap = process.stdout.readline().strip()  # type: ignore[union-attr]
        assert "Apache Kafka" in banner and bootstrap.startswith("127.0.0.1:")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        assert len(admin.list_topics(timeout=20).brokers) == 1
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
    assert os.path.exists(tmp_path / "k" / "logs" / "meta.properties")


def test_records_and_address_survive_a_restart_on_the_same_data_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A new EmbeddedKafka on the data dir (as when `coordinator kafka --data-dir` runs again) comes back at the
    same bootstrap with the records."""
    data_dir = tmp_path / "kafka"
    first = EmbeddedKafka(data_dir)
    first.start_blocking()
    try:
        bootstrap = first.bootstrap
        topic = _topic()
        _create(bootstrap, topic)
        values = [f"kept-{i}".encode() for i in range(10)]
        _produce_confluent(bootstrap, topic, values)
        first_pid = first.pid
    finally:
        first.stop_blocking()

    # the stored port taken by someone else: a clear refusal, no JVM started
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", first.port))
    squatter.listen()
    try:
        with pytest.raises(BrokerStartError, match=f"{first.port}.*in use"):
            EmbeddedKafka(data_dir).start_blocking()
    finally:
        squatter.close()

    second = EmbeddedKafka(data_dir)
    assert second.bootstrap == bootstrap
    second.start_blocking()
    try:
        assert second.pid != first_pid
        assert _consume_confluent(bootstrap, topic, len(values)) == values
        assert _high_watermark(bootstrap, topic) == len(values)
    finally:
        second.stop_blocking()
