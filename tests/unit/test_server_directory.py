"""FindCoordinator and Metadata with several instances: the answers come from the directory (the owner map)."""

from __future__ import annotations

import pytest

from coordinator.server.context import Node
from protocol.apis import ApiKey
from tests.support.server import RunningServer
from tests.support.wire import request

ME = 7
OTHER = Node(9, "coordinator-b.example", 29092, "c")
THIRD = Node(11, "coordinator-c.example", 39092, "c")


class FakeDirectory:
    """Groups named "b-*" are OTHER's, "me-*" ours, anything else has no known owner (its partition is moving)."""

    def __init__(self, me: Node) -> None:
        self.me = me

    def coordinator_node(self, group_id: str) -> Node | None:
        return {"b": OTHER, "me": self.me}.get(group_id.split("-")[0])

    def nodes(self) -> list[Node]:
        return [OTHER, self.me, THIRD]


def _env() -> RunningServer:
    me = Node(ME, "coordinator.example", 19092, "c")
    return RunningServer(node_id=ME, advertised_host=me.host, advertised_port=me.port, directory=FakeDirectory(me))


@pytest.mark.parametrize("version", [0, 3])
async def test_find_coordinator_v0_to_3_answers_the_owner_or_not_available(version: int) -> None:
    async with _env() as env:
        client = await env.client()
        answers = []
        for group in ("b-orders", "me-orders", "moving"):
            found = await client.request(request(ApiKey.FIND_COORDINATOR, version, key=group, key_type=0))
            answers.append((int(found.error_code), found.node_id, found.host, found.port))
        assert answers == [(0, 9, "coordinator-b.example", 29092), (0, ME, "coordinator.example", 19092),
                           (15, -1, "", -1)]


@pytest.mark.parametrize("version", [4, 6])
async def test_find_coordinator_batches_answer_each_key(version: int) -> None:
    async with _env() as env:
        client = await env.client()
        found = await client.request(request(ApiKey.FIND_COORDINATOR, version, key_type=0,
                                             coordinator_keys=("b-1", "moving", "me-1")))
        assert [(c.key, int(c.error_code), c.node_id, c.port) for c in found.coordinators] == [
            ("b-1", 0, 9, 29092), ("moving", 15, -1, -1), ("me-1", 0, ME, 19092)]
        txn = await client.request(request(ApiKey.FIND_COORDINATOR, version, key_type=1, coordinator_keys=("b-1",)))
        assert [(int(c.error_code), c.node_id) for c in txn.coordinators] == [(15, -1)]  # no relay: not ours


@pytest.mark.parametrize("version", [0, 12])
async def test_metadata_lists_every_instance_with_this_one_the_controller(version: int) -> None:
    async with _env() as env:
        client = await env.client()
        metadata = await client.request(request(ApiKey.METADATA, version, topics=(), allow_auto_topic_creation=False,
                                                include_cluster_authorized_operations=False,
                                                include_topic_authorized_operations=False))
        assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [
            (ME, "coordinator.example", 19092), (9, "coordinator-b.example", 29092),
            (11, "coordinator-c.example", 39092)]
        if version >= 1:
            assert metadata.controller_id == ME


async def test_without_a_directory_this_node_coordinates_everything() -> None:
    async with RunningServer(node_id=ME) as env:
        client = await env.client()
        found = await client.request(request(ApiKey.FIND_COORDINATOR, 3, key="moving", key_type=0))
        assert (int(found.error_code), found.node_id) == (0, ME)
        metadata = await client.request(request(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                                include_cluster_authorized_operations=False,
                                                include_topic_authorized_operations=False))
        assert [b.node_id for b in metadata.brokers] == [ME]
