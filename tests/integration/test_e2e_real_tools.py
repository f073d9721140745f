"""What a user pointing real tools at `coordinator serve` meets: librdkafka's AdminClient managing groups and
offsets (and the result surviving a restart), a librdkafka consumer living in a group, aiokafka's coordinator
lookup, and a static member (ApiVersions v4, JoinGroup v9) restarting against a restarting coordinator."""

from __future__ import annotations

import asyncio
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.test_e2e_support import fetch_offsets, service, unique, until_loaded

TIMEOUT_S = 15
FAST = ("group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000")


def _admin(port: int) -> AdminClient:
    return AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "client.id": "e2e-admin"})


def _alter(port: int, group_id: str, offsets: dict[int, int]) -> list[tuple[int, int, Any]]:
    request = ConsumerGroupTopicPartitions(group_id, [TopicPartition("orders", p, o) for p, o in offsets.items()])
    admin = _admin(port)  # kept referenced until the result is in: destroying it fails the request
    altered = admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group_id].result(TIMEOUT_S)
    return [(tp.partition, tp.offset, tp.error) for tp in altered.topic_partitions]


def _list_offsets(port: int, group_id: str, partitions: tuple[int, ...]) -> dict[int, int]:
    request = ConsumerGroupTopicPartitions(group_id, [TopicPartition("orders", p) for p in partitions])
    admin = _admin(port)
    result = admin.list_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group_id].result(TIMEOUT_S)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def _groups(port: int) -> dict[str, str]:
    admin = _admin(port)
    listed = admin.list_consumer_groups(request_timeout=TIMEOUT_S).result(TIMEOUT_S)
    return {g.group_id: g.state.name for g in listed.valid}


def _describe(port: int, group_id: str) -> Any:
    admin = _admin(port)
    return admin.describe_consumer_groups([group_id], request_timeout=TIMEOUT_S)[group_id].result(TIMEOUT_S)


def _delete(port: int, group_id: str) -> str | None:
    try:
        admin = _admin(port)
        admin.delete_consumer_groups([group_id], request_timeout=TIMEOUT_S)[group_id].result(TIMEOUT_S)
        return None
    except KafkaException as exc:
        return exc.args[0].name()


async def test_admin_client_manages_groups_and_offsets_across_a_restart(kafka_bootstrap: str) -> None:
    state_topic = unique("__state")
    kept, deleted = "tools-kept", "tools-deleted"
    async with service(kafka_bootstrap, state_topic, *FAST) as running:
        probe = await running.client()
        await until_loaded(probe)
        port = running.port
        run = asyncio.to_thread
        assert await run(_alter, port, kept, {0: 5, 1: 6}) == [(0, 5, None), (1, 6, None)]
        assert await run(_alter, port, deleted, {0: 7}) == [(0, 7, None)]
        assert await run(_list_offsets, port, kept, (0, 1, 2)) == {0: 5, 1: 6, 2: -1001}
        assert await run(_groups, port) == {kept: "EMPTY", deleted: "EMPTY"}
        described = await run(_describe, port, kept)
        assert (described.state.name, described.members, described.coordinator.port) == ("EMPTY", [], port)
        assert await run(_delete, port, deleted) is None
        assert await run(_delete, port, deleted) == "GROUP_ID_NOT_FOUND"
        assert await run(_groups, port) == {kept: "EMPTY"}
        await probe.close()
        assert await running.terminate() == 0

    async with service(kafka_bootstrap, state_topic, *FAST) as restarted:
        probe = await restarted.client()
        await until_loaded(probe)
        assert await asyncio.to_thread(_groups, restarted.port) == {kept: "EMPTY"}
        assert await fetch_offsets(probe, kept, (0, 1)) == {0: 5, 1: 6}
        assert await fetch_offsets(probe, deleted, (0,)) == {0: -1}
        await probe.close()
