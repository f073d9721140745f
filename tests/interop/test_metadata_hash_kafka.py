"""The consumer group metadata hash (record 3's MetadataHash) is Kafka 4.1's: a group formed on Kafka 4.1.1's own
coordinator and the same group formed on ours (relaying to the same broker: the same topic ids, partitions and
racks) write the same hash, for one topic and for two (ordered by name), on a broker without a rack and on one
with a rack that is not ASCII (UTF-16 surrogates), and on a two-broker cluster whose second broker is down (fenced)
when our coordinator starts: its rack is still in Kafka's image, and learnt by ours from DescribeCluster v2. Kafka's
own Utils/ModernGroup compute the hash of made-up images too (several brokers and racks per partition, racks to
sort, brokers unknown), compared with ours."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Collection, Iterator
from contextlib import asynccontextmanager

import pytest

from coordinator.embedded import EmbeddedKafka, KafkaNode
from coordinator.embedded.broker import random_cluster_id
from coordinator.group.modern.records import GroupEpochRecord
from coordinator.group.modern.topics import metadata_hash
from coordinator.relay.cluster import ClusterMetadata
from coordinator.storage.consumer_records import CONSUMER_GROUP_TYPES, decode, record_type_of
from coordinator.topics import StaticTopics, TopicImage
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support import kafka_java
from tests.support.consumer_group_differential import Answer, Side, close, connect
from tests.support.instances import read_raw
from tests.support.polling import wait_until
from tests.support.relay import create_topic
from tests.support.service import service, unique
from tests.support.wire import request

pytestmark = pytest.mark.interop

RACK = "r\u00e4ck-\U0001d538"  # ä, and 𝔸 (two UTF-16 code units)
RACK_PROPERTY = "r\\u00e4ck-\\ud835\\udd38"  # server.properties is read as ISO-8859-1: the same rack, escaped
TIMEOUT_S = 60
NOT_READY = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR


@pytest.fixture(scope="module")
def racked_broker() -> Iterator[EmbeddedKafka]:
    kafka = EmbeddedKafka(extra_properties={"broker.rack": RACK_PROPERTY, "offsets.topic.num.partitions": "1"})
    kafka.start_blocking()
    try:
        yield kafka
    finally:
        kafka.stop_blocking()
        kafka.remove_data()


@pytest.fixture(scope="module")
def two_racks() -> Iterator[tuple[KafkaNode, KafkaNode]]:
    """Broker 1 (the controller too, rack-1) and broker 2 (a broker only, rack-2): stopping broker 2 keeps the
    cluster, with broker 2 registered and fenced."""
    small = {"heap_mb": 384, "jvm_options": ("-XX:TieredStopAtLevel=1",)}
    settings = {"offsets.topic.num.partitions": "1", "offsets.topic.replication.factor": "2"}
    controller = KafkaNode(node_id=1, extra_properties={**settings, "broker.rack": "rack-1"}, **small)
    broker = KafkaNode(node_id=2, extra_properties={**settings, "broker.rack": "rack-2", "process.roles": "broker"},
                       **small)
    broker.extra_properties["listeners"] = f"PLAINTEXT://127.0.0.1:{broker.port}"
    cluster_id = random_cluster_id()
    for node in (controller, broker):
        node.controller_quorum, node.cluster_id = f"1@127.0.0.1:{controller.controller_port}", cluster_id
        node.expected_node_ids = {1, 2}
    try:
        for node in (controller, broker):
            node.launch()
        for node in (controller, broker):
            node.wait_ready()
        yield controller, broker
    finally:
        for node in (broker, controller):
            node.stop_blocking()
            node.remove_data()


@asynccontextmanager
async def kafka_and_ours(bootstrap: str) -> AsyncIterator[tuple[Side, Side, str]]:
    """Kafka's coordinator and ours (relaying to the same broker), and our state topic."""
    host, port = bootstrap.rsplit(":", 1)
    state_topic = unique("__state")
    async with service(bootstrap, state_topic, "offsets.topic.num.partitions=1", relay=True) as running:
        kafka = await connect(host, int(port), "probe")
        ours = await connect("127.0.0.1", running.port, "probe")
        try:
            yield Side("Kafka", kafka), Side("ours", ours), state_topic
        finally:
            await close(kafka, ours)


def last_hashes(bootstrap: str, topic: str, group_ids: Collection[str]) -> dict[str, int]:
    """The MetadataHash of each group's last record 3 in a topic of `__consumer_offsets` format."""
    hashes = {}
    for key, value, _partition, _offset in read_raw(bootstrap, topic):
        if key is None or value is None or record_type_of(key) not in CONSUMER_GROUP_TYPES:
            continue
        record = decode(key, value)
        if isinstance(record, GroupEpochRecord) and record.group_id in group_ids:
            hashes[record.group_id] = record.metadata_hash
    assert hashes.keys() == set(group_ids), f"record 3 of {group_ids} in {topic}: {hashes}"
    return hashes


async def cluster_view(client: KafkaClient, topics: tuple[str, ...]) -> ClusterMetadata:
    """Our relay's view of the cluster, learned from the broker's own Metadata answer."""
    async def no_refresh(_names: list[str]) -> None:
        raise AssertionError("not asked")

    view = ClusterMetadata(no_refresh, 0)
    answer = await client.request(request(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                          include_topic_authorized_operations=False))
    view.observe(answer, all_topics=True)
    assert all(view.by_name(t) is not None for t in topics)
    return view


async def join(side: Side, group: str, member_id: str, topics: tuple[str, ...]) -> Answer:
    """A first heartbeat, sent again as a client does while the group's coordinator is not ready (a broker's
    `__consumer_offsets` partitions load one by one after the topic is created)."""
    async def answered() -> Answer | None:
        answer = await side.heartbeat(group, member_id, 0, topics=topics, rebalance_timeout_ms=30_000, owned={})
        return None if answer.error in NOT_READY else answer

    answer: Answer = await wait_until(answered, TIMEOUT_S, f"{side.name} serving {group}", interval_s=0.2)
    return answer


async def same_hash_on_both(bootstrap: str, rack: str | None) -> None:
    six, three = unique("hash-b6"), unique("hash-a3")  # "hash-a..." sorts first: the group hash orders by name
    for topic, partitions in ((six, 6), (three, 3)):
        await asyncio.to_thread(create_topic, bootstrap, topic, partitions)
    async with kafka_and_ours(bootstrap) as (kafka, ours, state_topic):
        view = await cluster_view(kafka.client, (six, three))
        image = view.by_name(six)
        assert image is not None and image.racks == (((rack,),) * 6 if rack is not None else ())
        groups = {unique("hash-group"): (six,), unique("hash-group"): (six, three)}
        for group, subscribed in groups.items():
            member_id = str(uuid.uuid4())
            for side in (kafka, ours):
                joined = await join(side, group, member_id, subscribed)
                assert joined.error == 0 and joined.member_epoch == 1, (side.name, joined)
                assert sum(len(ps) for _, ps in joined.assignment or ()) == (6 if len(subscribed) == 1 else 9)
        kafka_hashes, our_hashes = [await asyncio.to_thread(last_hashes, bootstrap, topic, groups)
                                    for topic in ("__consumer_offsets", state_topic)]
        assert our_hashes == kafka_hashes  # through our coordinator and its relay
        assert {g: metadata_hash(subscribed, view) for g, subscribed in groups.items()} == kafka_hashes
        assert len(set(kafka_hashes.values()) - {0}) == 2


async def test_kafka_and_we_write_the_same_metadata_hash(kafka_bootstrap: str) -> None:
    await same_hash_on_both(kafka_bootstrap, None)


async def test_kafka_and_we_write_the_same_metadata_hash_with_a_rack(racked_broker: EmbeddedKafka) -> None:
    await same_hash_on_both(racked_broker.bootstrap, RACK)


def kafka_hashes(cases: list[list[str]]) -> list[int]:
    """Kafka's ModernGroup.computeMetadataHash for each case (MetadataHashCheck's input lines)."""
    text = "\n\n".join("\n".join(lines) for lines in cases) + "\n"
    lines = kafka_java.run("MetadataHashCheck", text)
    values = [int(line.split("\t")[1]) for line in lines]
    assert len(values) == len(cases)
    return values


BROKER_RACKS = {0: "rack-b", 1: "rack-a", 2: None, 3: "rack-a", 4: "\U0001d538", 5: "\uff21", 6: ""}


def case(topics: list[tuple[uuid.UUID, str, list[list[int]]]], subscribed: list[str]) -> tuple[list[str], int]:
    """MetadataHashCheck's lines for an image of BROKER_RACKS' brokers and `topics` (each partition's replicas;
    broker 9 is not registered), and our hash of the same."""
    lines = [f"broker\t{b}" + ("" if rack is None else f"\t{rack}") for b, rack in BROKER_RACKS.items()]
    images = []
    for topic_id, name, replicas in topics:
        lines.append("\t".join(["topic", str(topic_id), name, *(",".join(map(str, r)) for r in replicas)]))
        racks = tuple(tuple(rack for rack in (BROKER_RACKS.get(b) for b in r) if rack is not None) for r in replicas)
        images.append(TopicImage(topic_id, name, len(replicas), racks if any(racks) else ()))
    lines.append("\t".join(["group", *subscribed]))
    return lines, metadata_hash(subscribed, StaticTopics(images))


def test_our_hash_is_kafkas_for_made_up_images() -> None:
    foo, bar, baz = uuid.UUID(int=(1 << 127) | 42), uuid.UUID(int=7), uuid.uuid4()
    cases = [
        case([(foo, "foo", [[0, 1], [1, 0, 2], [3, 1], [9]])], ["foo"]),  # racks sorted, duplicates kept
        case([(foo, "foo", [[4, 5], [5, 4, 6]])], ["foo"]),  # 𝔸 (surrogates) sorts before Ａ (U+FF21) in Java
        case([(foo, "foo", [[2], [9]])], ["foo"]),  # no rack at all
        case([(foo, "foo", [[0]]), (bar, "bar", [[1], [2], [3]]), (baz, "baz", [])], ["foo", "bar", "gone"]),
        case([(foo, "foo", [[0]]), (bar, "bar", [[1]])], ["gone"]),  # nothing subscribed exists: 0
        case([(foo, "f\u00f6\u00f6-\U0001f600", [[0, 1, 2, 3, 4, 5, 6]] * 3)], ["f\u00f6\u00f6-\U0001f600"]),
    ]
    ours = [value for _lines, value in cases]
    assert kafka_hashes([lines for lines, _value in cases]) == ours
    assert ours[4] == 0 and len(set(ours)) == len(ours)


async def test_a_broker_down_since_before_our_start_still_adds_its_rack(two_racks: tuple[KafkaNode, KafkaNode]
                                                                         ) -> None:
    """Broker 2 holds a replica of every partition and is stopped (fenced, still registered) before our coordinator
    starts, so no Metadata answer ours sees names it: its rack is in the hash Kafka writes and in ours."""
    controller, broker = two_racks
    bootstrap = controller.bootstrap
    topic = unique("hash-fenced")
    await asyncio.to_thread(create_topic, bootstrap, topic, 3, 2)
    host, port = bootstrap.rsplit(":", 1)
    # FindCoordinator creates __consumer_offsets on both brokers while both run (its leader then moves to broker 1)
    await close(await connect(host, int(port), "probe"))
    await asyncio.to_thread(broker.stop_blocking)

    async def fenced() -> bool:
        return await asyncio.to_thread(controller.probe_node_ids) == {1}

    await wait_until(fenced, TIMEOUT_S, "broker 2 fenced", interval_s=0.2)
    group, member_id = unique("hash-group"), str(uuid.uuid4())
    async with kafka_and_ours(bootstrap) as (kafka, ours, state_topic):
        for side in (kafka, ours):
            joined = await join(side, group, member_id, (topic,))
            assert joined.error == 0 and joined.member_epoch == 1, (side.name, joined)
        kafka_hash, our_hash = [(await asyncio.to_thread(last_hashes, bootstrap, t, {group}))[group]
                                for t in ("__consumer_offsets", state_topic)]
        metadata_only = await cluster_view(kafka.client, (topic,))
    image = metadata_only.by_name(topic)
    assert image is not None and image.racks == (("rack-1",),) * 3  # Metadata names broker 1 alone
    with_fenced = StaticTopics([dataclasses.replace(image, racks=(("rack-1", "rack-2"),) * 3)])
    assert our_hash == kafka_hash == metadata_hash([topic], with_fenced) != metadata_hash([topic], metadata_only)
