"""The relay's topic cache keeps nothing per topic name a client merely asked about (found by the relay fuzzer:
every distinct topic name in an OffsetCommit left a refresh time behind for good), and learns the racks of brokers
no Metadata answer names from the cluster's list of registered brokers."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from types import SimpleNamespace

from kio.schema.describe_cluster.v2.response import DescribeClusterBroker, DescribeClusterResponse
from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId
from kio.static.primitive import i32, i32Timedelta

from coordinator.relay.cluster import _PRUNE_ABOVE, ClusterMetadata


async def test_refresh_times_of_unknown_topics_do_not_accumulate() -> None:
    asked: list[list[str]] = []

    async def refresh(topics: list[str]) -> SimpleNamespace:
        asked.append(topics)
        return SimpleNamespace(topics=[SimpleNamespace(name=t, error_code=3, partitions=()) for t in topics])

    cluster = ClusterMetadata(refresh, min_interval_ms=0)
    for n in range(3 * _PRUNE_ABOVE):
        assert await cluster.missing([(f"typo-{n}", 0)]) == {(f"typo-{n}", 0)}
    assert len(asked) == 3 * _PRUNE_ABOVE
    assert len(cluster._refreshed_at) <= _PRUNE_ABOVE + 1


async def test_a_topic_refreshed_within_the_min_interval_is_not_asked_for_again() -> None:
    asked: list[list[str]] = []

    async def refresh(topics: list[str]) -> SimpleNamespace:
        asked.append(topics)
        return SimpleNamespace(topics=[])

    cluster = ClusterMetadata(refresh, min_interval_ms=60_000)
    for n in range(_PRUNE_ABOVE + 10):  # past the pruning size: recent times are kept
        await cluster.missing([(f"t-{n}", 0)])
    await cluster.missing([("t-0", 0), (f"t-{_PRUNE_ABOVE + 5}", 0)])
    assert len(asked) == _PRUNE_ABOVE + 10


# Racks of every registered broker (DescribeCluster v2, fenced brokers included): Kafka's image has a fenced broker's
# rack, and a group's metadata hash counts it, so the cluster view learns brokers no Metadata answer names.

def _metadata(brokers: dict[int, str | None], replicas: dict[str, list[list[int]]]) -> SimpleNamespace:
    """A Metadata answer (the fields the cluster view reads): unfenced brokers only, as Kafka answers."""
    return SimpleNamespace(brokers=[SimpleNamespace(node_id=b, rack=r) for b, r in brokers.items()], topics=[
        SimpleNamespace(name=name, error_code=0, topic_id=uuid.uuid5(uuid.NAMESPACE_OID, name), partitions=[
            SimpleNamespace(partition_index=i, replica_nodes=r) for i, r in enumerate(rs)])
        for name, rs in replicas.items()])


def _registered(brokers: dict[int, tuple[str | None, bool]], error: ErrorCode = ErrorCode.none
                ) -> DescribeClusterResponse:
    """Kafka 4's DescribeCluster v2 answer with IncludeFencedBrokers: broker -> (rack, fenced)."""
    return DescribeClusterResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)), error_code=error, cluster_id="c",
        controller_id=BrokerId(1), brokers=tuple(
            DescribeClusterBroker(broker_id=BrokerId(b), host="127.0.0.1", port=i32(9092 + b), rack=rack,
                                  is_fenced=fenced)
            for b, (rack, fenced) in brokers.items()))


class Cluster:
    """A cluster's answers, in the order it gives them, and what it was asked."""

    def __init__(self, metadata: SimpleNamespace, *registered: DescribeClusterResponse | None) -> None:
        self.metadata, self.registered = metadata, list(registered)
        self.listings = 0

    async def refresh(self, _topics: list[str]) -> SimpleNamespace:
        return self.metadata

    async def registered_brokers(self) -> DescribeClusterResponse | None:
        self.listings += 1
        await asyncio.sleep(0)  # an answer comes later: concurrent callers meet
        return self.registered.pop(0)


async def test_a_fenced_brokers_rack_is_learnt_from_the_registered_brokers() -> None:
    cluster = Cluster(_metadata({1: "rack-1"}, {"foo": [[1, 2], [2, 1]]}),
                      _registered({1: ("rack-1", False), 2: ("rack-2", True)}))
    view = ClusterMetadata(cluster.refresh, 0, registered_brokers=cluster.registered_brokers)
    await asyncio.gather(view.refresh(["foo"], 0), view.refresh(["foo"], 0))  # one listing for both
    assert cluster.listings == 1
    foo = view.by_name("foo")
    assert foo is not None and foo.racks == (("rack-1", "rack-2"), ("rack-2", "rack-1"))
    await view.refresh(["foo"], 0)  # every replica's broker known now: not listed again
    assert cluster.listings == 1 and view.by_name("foo") is foo


async def test_brokers_the_list_lacks_are_not_asked_about_again_and_an_unregistered_broker_loses_its_rack() -> None:
    cluster = Cluster(_metadata({1: "rack-1"}, {"foo": [[1, 2, 3]]}),
                      _registered({1: ("rack-1", False)}))  # 2 never registered, 3 unregistered since it was seen
    view = ClusterMetadata(cluster.refresh, 0, registered_brokers=cluster.registered_brokers)
    view.observe(_metadata({1: "rack-1", 3: "rack-3"}, {}), all_topics=False)
    for _ in range(3):
        await view.refresh(["foo"], 0)
    assert cluster.listings == 1
    assert view.by_name("foo").racks == (("rack-1",),)  # type: ignore[union-attr]


async def test_a_cluster_without_the_list_or_answering_an_error_changes_no_rack() -> None:
    for answer in (None, _registered({}, ErrorCode.unknown_server_error)):
        cluster = Cluster(_metadata({1: "rack-1"}, {"foo": [[1, 2]]}), answer)
        view = ClusterMetadata(cluster.refresh, 0, registered_brokers=cluster.registered_brokers)
        await view.refresh(["foo"], 0)
        await view.refresh(["foo"], 0)
        assert cluster.listings == 1
        assert view.by_name("foo").racks == (("rack-1",),)  # type: ignore[union-attr]


async def test_a_failed_listing_leaves_the_topics_served_and_is_asked_again() -> None:
    cluster = Cluster(_metadata({1: "rack-1"}, {"foo": [[1, 2]]}), _registered({2: ("rack-2", True),
                                                                                1: ("rack-1", False)}))
    failures = [ConnectionError("down")]

    async def flaky() -> DescribeClusterResponse | None:
        if failures:
            raise failures.pop()
        return await cluster.registered_brokers()

    view = ClusterMetadata(cluster.refresh, 0, registered_brokers=flaky)
    await view.refresh(["foo"], 0)
    assert view.by_name("foo").racks == (("rack-1",),)  # type: ignore[union-attr]
    await view.refresh(["foo"], 0)
    assert view.by_name("foo").racks == (("rack-1", "rack-2"),)  # type: ignore[union-attr]


def test_the_version_grows_when_a_topic_is_created_not_when_one_is_deleted() -> None:
    """Kafka's coordinator resolves regular expressions again for an image with created topics
    (lastMetadataImageWithNewTopics), not for deleted ones; a name created again under a new id is a created topic."""
    view = ClusterMetadata(_never_asked, 0)
    view.observe(_metadata({}, {"foo": [[1]], "bar": [[1]]}), all_topics=True)
    assert view.version == 1
    view.observe(_metadata({}, {"foo": [[1]]}), all_topics=True)  # bar deleted
    assert view.version == 1 and view.partition_count("bar") is None
    recreated = _metadata({}, {"foo": [[1]]})
    recreated.topics[0].topic_id = uuid.uuid4()
    view.observe(recreated, all_topics=True)
    view.observe(recreated, all_topics=False)
    assert view.version == 2
    view.observe(_metadata({}, {"bar": [[1]]}), all_topics=False)  # bar created again
    assert view.version == 3


async def _never_asked(_topics: list[str]) -> None:
    raise AssertionError("not asked")
