"""The embedded 3-broker KRaft cluster is a real cluster: leaders on every broker, failover, a broker rejoining."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from coordinator.embedded import EmbeddedKafkaCluster

PARTITIONS = 6
# a bound, not a wait: each record is committed synchronously, which a loaded machine does a few times a second
# (225 of 300 records in 60 s at load average ~33)
CONSUME_WITHIN_S = 180


def _until(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.25)


def _partition_state(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int]]]:
    """partition -> (leader, in-sync replicas), fresh from the cluster's metadata."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=20)
    partitions = metadata.topics[topic].partitions
    return {p: (partitions[p].leader, sorted(partitions[p].isrs)) for p in partitions}


def _produce(bootstrap: str, topic: str, keys: range) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "log_level": 3})
    for i in keys:
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(60) == 0


def _group_consumer(bootstrap: str, group: str, topic: str) -> Consumer:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 10_000, "log_level": 3,
    })
    consumer.subscribe([topic])
    return consumer


def _consume_until(consumer: Consumer, seen: set[str], wanted: set[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not wanted <= seen and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error() is not None:
            continue  # errors here are transient (a broker going away) and retried by librdkafka
        seen.add(message.key().decode())
        consumer.commit(message, asynchronous=False)
    missing = wanted - seen
    assert not missing, f"{len(missing)} records never consumed, e.g. {sorted(missing)[:5]}"


def _new_topic(cluster: EmbeddedKafkaCluster) -> str:
    topic = f"c-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=3)])[topic].result(60)
    _until(lambda: len(_partition_state(cluster.bootstrap, topic)) == PARTITIONS, 30, "topic metadata")
    return topic


def test_three_brokers_each_with_its_own_address(kafka_cluster: EmbeddedKafkaCluster) -> None:
    addresses = kafka_cluster.addresses()
    assert kafka_cluster.node_ids == [1, 2, 3]
    assert len(set(addresses.values())) == 3
    metadata = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap}).list_topics(timeout=20)
    assert {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()} == addresses
    # each broker, asked on its own address, knows the whole cluster
    for address in addresses.values():
        assert set(AdminClient({"bootstrap.servers": address}).list_topics(timeout=20).brokers) == {1, 2, 3}


def test_replicated_topic_led_by_every_broker_survives_a_broker_restart(
    kafka_cluster: EmbeddedKafkaCluster,
) -> None:
    topic = _new_topic(kafka_cluster)
    state = _partition_state(kafka_cluster.bootstrap, topic)
    assert {leader for leader, _ in state.values()} == {1, 2, 3}, state
    assert all(isr == [1, 2, 3] for _, isr in state.values()), state

    consumer = _group_consumer(kafka_cluster.bootstrap, f"g-{uuid.uuid4().hex[:8]}", topic)
    seen: set[str] = set()
    try:
        _produce(kafka_cluster.bootstrap, topic, range(0, 300))
        _consume_until(consumer, seen, {f"k{i}" for i in range(300)}, CONSUME_WITHIN_S)

        victim = state[0][0]  # the leader of partition 0
        led_by_victim = {p for p, (leader, _) in state.items() if leader == victim}
        kafka_cluster.stop_broker(victim)
        assert victim not in kafka_cluster.running_node_ids()
        survivors = {1, 2, 3} - {victim}

        def moved() -> bool:
            now = _partition_state(kafka_cluster.bootstrap, topic)
            return all(now[p][0] in survivors and victim not in now[p][1] for p in now)

        _until(moved, 30, f"leadership and ISR away from stopped broker {victim}")
        after = _partition_state(kafka_cluster.bootstrap, topic)
        assert {after[p][0] for p in led_by_victim} <= survivors

        # acks=all still succeeds (min.insync.replicas=2) and the same consumer goes on without a gap
        _produce(kafka_cluster.bootstrap, topic, range(300, 600))
        _consume_until(consumer, seen, {f"k{i}" for i in range(600)}, CONSUME_WITHIN_S)

        kafka_cluster.start_broker(victim)
        assert victim in kafka_cluster.running_node_ids()

        def rejoined() -> bool:
            now = _partition_state(kafka_cluster.bootstrap, topic)
            in_sync = all(isr == [1, 2, 3] for _, isr in now.values())
            # the preferred-leader election (every 5 s here) gives the victim its partitions back
            return in_sync and {leader for leader, _ in now.values()} == {1, 2, 3}

        _until(rejoined, 90, f"broker {victim} back in every ISR and leading again")
        _produce(kafka_cluster.bootstrap, topic, range(600, 700))
        _consume_until(consumer, seen, {f"k{i}" for i in range(700)}, CONSUME_WITHIN_S)
    finally:
        consumer.close()
        for node_id in set(kafka_cluster.node_ids) - set(kafka_cluster.running_node_ids()):
            kafka_cluster.start_broker(node_id)  # leave the module's cluster whole for the next test


async def test_the_state_topic_gets_the_replication_factor_given_by_its_kafka_name(
    kafka_cluster: EmbeddedKafkaCluster,
) -> None:
    """`--config offsets.topic.replication.factor=2` on three brokers: the created state topic has two replicas
    per partition (the default would give three), as the cluster itself describes it."""
    from coordinator.app import _storage_config
    from coordinator.cli import build_parser
    from coordinator.commands.serve import _service_options
    from coordinator.storage.topics import Admin, ensure_state_topic

    topics = {}
    for setting in ("offsets.topic.replication.factor=2", None):
        topic = f"state-{uuid.uuid4().hex[:10]}"
        argv = ["serve", "--bootstrap-server", kafka_cluster.bootstrap, "--state-topic", topic,
                "--config", "offsets.topic.num.partitions=3"] + (["--config", setting] if setting else [])
        config = _storage_config(_service_options(build_parser().parse_args(argv)), kafka_cluster.bootstrap)
        admin = Admin(config)
        try:
            await ensure_state_topic(admin, config)
        finally:
            admin.release()
        topics[setting] = topic
    for setting, replicas in (("offsets.topic.replication.factor=2", 2), (None, 3)):
        admin_client = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        # the broker asked may not have the new topic in its metadata yet (a loaded cluster): wait for it, bounded
        partitions = _until(lambda: admin_client.list_topics(topics[setting], timeout=20).topics[topics[setting]]
                            .partitions, 60, f"{topics[setting]} in the metadata")
        assert len(partitions) == 3
        assert {len(p.replicas) for p in partitions.values()} == {replicas}, (setting, partitions)
