"""The consumer group metadata hash is Kafka 4.1's (Utils.computeTopicHash / computeGroupHash): fixed vectors taken
from Kafka 4.1.1 (tests/interop/test_metadata_hash_kafka.py: record 3 written by Kafka's own coordinator, and
Kafka's own functions on a made-up image); the relay's cluster view gives each topic its replicas' racks; a group
whose records carry the hash of an earlier release (a BLAKE2b digest) is bumped once, at its first metadata look."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import struct
import uuid
from collections.abc import Iterable
from types import SimpleNamespace

from coordinator.group.modern.records import GroupEpochRecord
from coordinator.group.modern.topics import metadata_hash, topic_hash
from coordinator.group.runtime import GroupRuntime
from coordinator.relay.cluster import ClusterMetadata
from coordinator.topics import StaticTopics, TopicImage
from protocol.error_codes import Errors
from tests.support.consumer_group_env import FOO, Env

RACK = "r\u00e4ck-\U0001d538"
# Kafka 4.1.1's coordinator, one broker (rack RACK or none), topics as created by the interop test
SIX = TopicImage(uuid.UUID("642d3f02-25da-4784-98c3-1d455841ae86"), "hash-b6-3ebebcf5", 6)
THREE = TopicImage(uuid.UUID("c62a08e2-dcd0-4987-af18-9d0e8bc63ad4"), "hash-a3-6396cc6f", 3)
RACKED_SIX = TopicImage(uuid.UUID("f419e62f-e8ad-4759-9e55-d1de3eea3e74"), "hash-b6-c9304fe5", 6, ((RACK,),) * 6)
RACKED_THREE = TopicImage(uuid.UUID("b9c0ed0d-3416-41d2-9074-21c46316aba2"), "hash-a3-eb92c0e1", 3, ((RACK,),) * 3)
# Kafka 4.1.1's Utils/ModernGroup on an image of brokers 0 (rack-a), 1 (rack-b), 2 (no rack)
MADE_UP_FOO = TopicImage(uuid.UUID("5f1a2c3e-0000-4000-8000-00000000000a"), "foo", 3,
                         (("rack-a", "rack-b"), ("rack-b",), ()))
MADE_UP_BAR = TopicImage(uuid.UUID("5f1a2c3e-0000-4000-8000-00000000000b"), "bar", 1, (("rack-a",),))


def test_kafkas_record_3_hashes() -> None:
    plain, racked = StaticTopics([SIX, THREE]), StaticTopics([RACKED_SIX, RACKED_THREE])
    assert metadata_hash([SIX.name], plain) == 2281856993614941012
    assert metadata_hash([SIX.name, THREE.name], plain) == -5107655354708455616
    assert metadata_hash([RACKED_SIX.name], racked) == -5418851422818209940
    assert metadata_hash([RACKED_SIX.name, RACKED_THREE.name], racked) == -1885881395513056099


def test_kafkas_hashes_of_a_made_up_image() -> None:
    topics = StaticTopics([MADE_UP_FOO, MADE_UP_BAR])
    assert topic_hash(MADE_UP_FOO) == -7419886976945615613
    assert metadata_hash(["foo"], topics) == 2542969086414980995
    assert metadata_hash(["foo", "bar", "missing", "foo"], topics) == -1036665403385034422
    assert metadata_hash(["missing"], topics) == metadata_hash([], topics) == 0


def test_every_input_enters_the_hash() -> None:
    base = metadata_hash(["foo"], StaticTopics([MADE_UP_FOO]))
    changed = [dataclasses.replace(MADE_UP_FOO, topic_id=uuid.uuid4()),
               dataclasses.replace(MADE_UP_FOO, partitions=4),
               dataclasses.replace(MADE_UP_FOO, racks=(("rack-a",), ("rack-b",), ())),
               dataclasses.replace(MADE_UP_FOO, racks=(("rack-a", "rack-b"), ("rack-b",), ("rack-c",))),
               dataclasses.replace(MADE_UP_FOO, racks=())]
    assert len({base, *(metadata_hash(["foo"], StaticTopics([image])) for image in changed)}) == 6
    # racks in another replica order: Kafka sorts them
    reordered = dataclasses.replace(MADE_UP_FOO, racks=(("rack-b", "rack-a"), ("rack-b",), ()))
    assert metadata_hash(["foo"], StaticTopics([reordered])) == base


def _answer(brokers: Iterable[SimpleNamespace], replicas: dict[str, list[list[int]]]) -> SimpleNamespace:
    """A Metadata answer (the fields the cluster view reads)."""
    return SimpleNamespace(brokers=list(brokers), topics=[
        SimpleNamespace(name=name, error_code=0, topic_id=uuid.uuid5(uuid.NAMESPACE_OID, name), partitions=[
            SimpleNamespace(partition_index=i, replica_nodes=r) for i, r in enumerate(rs)])
        for name, rs in replicas.items()])


async def _never(_names: list[str]) -> None:
    raise AssertionError("not asked")


def test_the_cluster_view_gives_each_partition_its_replicas_racks() -> None:
    view = ClusterMetadata(_never, 0)
    racked = [SimpleNamespace(node_id=0, rack="rack-b"), SimpleNamespace(node_id=1, rack="rack-a"),
              SimpleNamespace(node_id=2, rack=None)]
    view.observe(_answer(racked, {"foo": [[0, 1], [1, 2], [2]]}), all_topics=True)
    foo = view.by_name("foo")
    assert foo is not None and foo.racks == (("rack-b", "rack-a"), ("rack-a",), ())
    assert view.by_name("foo") is foo  # the same image until the topic changes: its hash is kept
    # a v0 answer (brokers without racks) and an answer leaving broker 0 out take no rack away
    view.observe(_answer([SimpleNamespace(node_id=0)], {"foo": [[0, 1], [1, 2], [2]]}), all_topics=True)
    view.observe(_answer(racked[1:], {"foo": [[0, 1], [1, 2], [2]]}), all_topics=True)
    assert view.by_name("foo") is foo
    view.observe(_answer([SimpleNamespace(node_id=2, rack="rack-c")], {"foo": [[0, 1], [1, 2], [2]]}),
                 all_topics=True)
    assert view.by_name("foo").racks == (("rack-b", "rack-a"), ("rack-a", "rack-c"), ("rack-c",))  # type: ignore
    view.observe(_answer([], {"foo": [[0], [1], [2], [0]]}), all_topics=True)  # a partition added, replicas moved
    assert view.by_name("foo").racks == (("rack-b",), ("rack-a",), ("rack-c",), ("rack-b",))  # type: ignore
    view.observe(_answer([SimpleNamespace(node_id=n, rack=None) for n in range(3)], {"foo": [[0], [1], [2], [0]]}),
                 all_topics=True)
    assert view.by_name("foo") == TopicImage(uuid.uuid5(uuid.NAMESPACE_OID, "foo"), "foo", 4, ())  # no rack known


def test_the_cluster_view_never_takes_partitions_from_a_topic_it_knows() -> None:
    """A lagging broker's answer showing fewer partitions under the same topic id is not believed (Kafka's metadata
    never shrinks a topic: its groups would bump their epoch down and up again); the same name under a new id (the
    topic deleted and created again) is a new topic."""
    view = ClusterMetadata(_never, 0)
    view.observe(_answer([], {"foo": [[0], [0], [0]]}), all_topics=True)
    foo = view.by_name("foo")
    for all_topics in (True, False):
        view.observe(_answer([], {"foo": [[0], [0]]}), all_topics=all_topics)
        assert view.partition_count("foo") == 3 and view.by_name("foo") is foo
    recreated = _answer([], {"foo": [[0]]})
    recreated.topics[0].topic_id = uuid.uuid4()
    view.observe(recreated, all_topics=True)
    assert view.partition_count("foo") == 1 and view.by_name("foo").topic_id == recreated.topics[0].topic_id  # type: ignore


def _earlier_release_hash(images: list[TopicImage]) -> int:
    """What record 3 carried before the hash was Kafka's: BLAKE2b-64 of id, name and partition count."""
    digest = hashlib.blake2b(digest_size=8)
    for image in sorted(images, key=lambda t: t.name):
        encoded = image.name.encode()
        digest.update(image.topic_id.bytes + struct.pack(">i", len(encoded)) + encoded
                      + struct.pack(">i", image.partitions))
    return struct.unpack(">q", digest.digest())[0] or 1


def test_a_group_written_with_the_earlier_hash_is_bumped_once_after_a_load() -> None:
    async def scenario() -> None:
        env = Env()
        restarted = Env()
        try:
            a = await env.heartbeat("a", 0)
            a = await env.heartbeat("a", a.member_epoch, owned=dict(a.assignment or []))
            foo = env.topics.by_name("foo")
            assert foo is not None and env.group().metadata_hash == metadata_hash(["foo"], env.topics)
            old = _earlier_release_hash([foo])
            env.store.consumer_records[:] = [
                dataclasses.replace(r, metadata_hash=old) if isinstance(r, GroupEpochRecord) else r
                for r in env.store.consumer_records]
            restarted.store = env.store
            restarted.runtime = GroupRuntime(restarted.config, restarted.timer, env.store, restarted.clock)
            restarted.runtime.consumer_groups.topics = restarted.topics
            await restarted.runtime.load()
            group = restarted.group()
            epoch = group.group_epoch
            assert group.metadata_hash == old
            restarted.clear_records()
            answer = await restarted.heartbeat("a", a.member_epoch, owned=dict(a.assignment or []))
            assert answer.error == Errors.NONE and answer.member_epoch == epoch + 1
            assert [r for r in restarted.records if isinstance(r, GroupEpochRecord)] == [
                GroupEpochRecord("g", epoch + 1, metadata_hash(["foo"], restarted.topics))]
            assert dict(answer.assignment or []) in ({}, dict(a.assignment or []))  # the same partitions
            assert restarted.group().targets["a"] == {FOO: tuple(range(6))}
            restarted.clear_records()
            restarted.advance(restarted.runtime.consumer_groups.settings.metadata_refresh_interval_ms)
            again = await restarted.heartbeat("a", answer.member_epoch, owned=dict(a.assignment or []))
            assert again.error == Errors.NONE and again.member_epoch == epoch + 1
            assert not [r for r in restarted.records if isinstance(r, GroupEpochRecord)]
        finally:
            for each in (env, restarted):
                await each.runtime.shutdown()
                await each.timer.close()

    asyncio.run(scenario())
