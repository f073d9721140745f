"""A second independent implementation: librdkafka (confluent-kafka's AdminClient) reads our flexible-version
answers to ApiVersions, Metadata, FindCoordinator, ListGroups, DescribeGroups, OffsetFetch and DeleteGroups.
The group is made through our own client first; librdkafka runs in a worker thread (it blocks)."""

from __future__ import annotations

import asyncio

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from protocol.apis import ApiKey
from tests.support.server import RunningServer
from tests.support.wire import join_with_member_id, nested, request, sync

TIMEOUT_S = 10


def _admin_view(port: int) -> dict:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "client.id": "rdkafka-admin"})
    listed = admin.list_consumer_groups(request_timeout=TIMEOUT_S).result(TIMEOUT_S)
    described = admin.describe_consumer_groups(["lib"], request_timeout=TIMEOUT_S)["lib"].result(TIMEOUT_S)
    request_offsets = ConsumerGroupTopicPartitions("lib", [TopicPartition("t", 0), TopicPartition("t", 1)])
    offsets = admin.list_consumer_group_offsets([request_offsets], request_timeout=TIMEOUT_S)["lib"].result(TIMEOUT_S)
    return {
        "listed": sorted(g.group_id for g in listed.valid),
        "state": described.state.name,
        "members": [(m.client_id, m.host) for m in described.members],
        "offsets": [(tp.partition, tp.offset) for tp in offsets.topic_partitions],
    }


def _delete(port: int, group_id: str) -> str | None:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    try:
        admin.delete_consumer_groups([group_id], request_timeout=TIMEOUT_S)[group_id].result(TIMEOUT_S)
        return None
    except Exception as exc:  # the future raises KafkaException with the broker's error code
        return exc.args[0].name() if exc.args and hasattr(exc.args[0], "name") else repr(exc)


async def test_librdkafka_admin_client_reads_our_answers() -> None:
    async with RunningServer() as env:
        client = await env.client(client_id="member-client")
        joined = await join_with_member_id(client, "lib")
        await sync(client, "lib", joined.generation_id, joined.member_id, {joined.member_id: b""})
        partition = nested(ApiKey.OFFSET_COMMIT, 9, "topics", "partitions")
        topic = nested(ApiKey.OFFSET_COMMIT, 9, "topics")
        await client.request(request(
            ApiKey.OFFSET_COMMIT, 9, group_id="lib", generation_id_or_member_epoch=joined.generation_id,
            member_id=joined.member_id, group_instance_id=None,
            topics=(topic(name="t", partitions=(partition(partition_index=0, committed_offset=17,
                                                          committed_leader_epoch=-1, committed_metadata=""),)),)))

        loop = asyncio.get_running_loop()
        view = await loop.run_in_executor(None, _admin_view, env.port)
        assert view == {
            "listed": ["lib"],
            "state": "STABLE",
            "members": [("member-client", "/127.0.0.1")],
            "offsets": [(0, 17), (1, -1001)],  # -1001: librdkafka's OFFSET_INVALID for "no committed offset"
        }
        assert await loop.run_in_executor(None, _delete, env.port, "lib") == "NON_EMPTY_GROUP"

        identity = nested(ApiKey.LEAVE_GROUP, 5, "members")
        left = await client.request(request(ApiKey.LEAVE_GROUP, 5, group_id="lib", members=(
            identity(member_id=joined.member_id, group_instance_id=None, reason="bye"),)))
        assert left.error_code == 0
        assert await loop.run_in_executor(None, _delete, env.port, "lib") is None
        assert "lib" not in env.coordinator.groups
