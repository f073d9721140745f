"""A topic's image on a cluster whose brokers have no rack is made without a pass over its partitions: it is made
again after every refresh of the topic (once a heartbeat interval while a consumer group uses it), on the loop."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

from coordinator.relay.cluster import ClusterMetadata


class _Unread:
    """A partition of a Metadata answer that fails the test when the cluster view reads it."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"partition {self.index}'s {name} read")


def _answer(racks: dict[int, str | None], partitions: list[object]) -> SimpleNamespace:
    return SimpleNamespace(brokers=[SimpleNamespace(node_id=b, rack=r) for b, r in racks.items()], topics=[
        SimpleNamespace(name="t", error_code=0, topic_id=uuid.uuid5(uuid.NAMESPACE_OID, "t"), partitions=partitions)])


async def _unused(_topics: list[str]) -> SimpleNamespace:
    raise AssertionError("no refresh expected")


def test_no_broker_with_a_rack_means_no_partition_is_read() -> None:
    view = ClusterMetadata(_unused, min_interval_ms=0)
    view.observe(_answer({1: None, 2: None}, [SimpleNamespace(partition_index=i, replica_nodes=[1, 2])
                                               for i in range(3)]), all_topics=False)
    first = view.by_name("t")
    assert first is not None and first.partitions == 3 and first.racks == ()
    # refreshed: a new answer, whose partitions must not be looked at to make the image again
    view.observe(_answer({1: None, 2: None}, [_Unread(i) for i in range(3)]), all_topics=False)
    again = view.by_name("t")
    assert again is first  # the same image object (the group hash caches by identity)


def test_a_broker_with_a_rack_still_gives_each_partition_its_racks() -> None:
    view = ClusterMetadata(_unused, min_interval_ms=0)
    view.observe(_answer({1: "a", 2: None}, [SimpleNamespace(partition_index=i, replica_nodes=[2, 1])
                                              for i in range(2)]), all_topics=False)
    image = view.by_name("t")
    assert image is not None and image.racks == (("a",), ("a",))
