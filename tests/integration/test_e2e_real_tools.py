"""What a user pointing real tools at `coordinator serve` meets: librdkafka's AdminClient managing groups and
offsets (and the result surviving a restart), a librdkafka consumer living in a group, aiokafka's coordinator
lookup, and a static member (ApiVersions v4, JoinGroup v9) restarting against a restarting coordinator."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.integration.test_e2e_support import describe, fetch_offsets, service, unique, until_loaded
from tests.unit.test_server_env import join, nested, request

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


async def test_aiokafka_finds_the_coordinator(kafka_bootstrap: str) -> None:
    from aiokafka.client import AIOKafkaClient, CoordinationType
    from aiokafka.errors import CoordinatorNotAvailableError

    async with service(kafka_bootstrap, unique("__state"), *FAST) as running:
        client = AIOKafkaClient(bootstrap_servers=f"127.0.0.1:{running.port}")
        try:
            await client.bootstrap()
            node_id = await client.coordinator_lookup(CoordinationType.GROUP, "aio-group")
            broker = client.cluster.broker_metadata(node_id)
            assert (node_id, broker.host, broker.port) == (0, "127.0.0.1", running.port)
            with pytest.raises(CoordinatorNotAvailableError):  # transactions are not ours
                await client.coordinator_lookup(CoordinationType.TRANSACTION, "aio-txn")
        finally:
            await client.close()


STATIC_GROUP = "static-app"
INSTANCE = "host-1"
FENCED_INSTANCE_ID = 82


async def static_client(port: int) -> tuple[KafkaClient, Any]:
    """A client that speaks ApiVersions v4 (KIP-511 name and version) before anything else."""
    client = await KafkaClient.connect("127.0.0.1", port, client_id="static-consumer", negotiate=False)
    versions = await client.request(request(ApiKey.API_VERSIONS, 4, client_software_name="e2e-static",
                                            client_software_version="1.0"))
    return client, versions


async def static_join(client: KafkaClient) -> Any:
    return await join(client, STATIC_GROUP, version=9, group_instance_id=INSTANCE, session_timeout_ms=10_000)


def static_heartbeat(generation: int, member_id: str) -> Any:
    return request(ApiKey.HEARTBEAT, 4, group_id=STATIC_GROUP, generation_id=generation, member_id=member_id,
                   group_instance_id=INSTANCE)


async def static_sync(client: KafkaClient, generation: int, member_id: str, assignment: bytes | None) -> Any:
    entry = nested(ApiKey.SYNC_GROUP, 5, "assignments")
    return await client.request(request(
        ApiKey.SYNC_GROUP, 5, group_id=STATIC_GROUP, generation_id=generation, member_id=member_id,
        group_instance_id=INSTANCE, protocol_type="consumer", protocol_name="range",
        assignments=() if assignment is None else (entry(member_id=member_id, assignment=assignment),)))


async def test_a_static_member_restarts_against_a_restarting_coordinator(kafka_bootstrap: str) -> None:
    state_topic = unique("__state")
    async with service(kafka_bootstrap, state_topic, *FAST) as running:
        client, versions = await static_client(running.port)
        await until_loaded(client, STATIC_GROUP)
        assert versions.error_code == 0
        ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in versions.api_keys}
        assert ranges[ApiKey.JOIN_GROUP][1] >= 9 and ranges[ApiKey.API_VERSIONS][1] >= 4
        first = await static_join(client)  # static members skip MEMBER_ID_REQUIRED
        assert (first.error_code, first.leader, first.generation_id) == (0, first.member_id, 1), first
        assert [(m.member_id, m.group_instance_id) for m in first.members] == [(first.member_id, INSTANCE)]
        synced = await static_sync(client, 1, first.member_id, b"partitions-0-1")
        assert (synced.error_code, bytes(synced.assignment)) == (0, b"partitions-0-1")
        assert (await client.request(static_heartbeat(1, first.member_id))).error_code == 0
        await client.close()

        # the consumer process restarts: same instance id, no member id → replaced without a rebalance
        client, _ = await static_client(running.port)
        second = await static_join(client)
        assert (second.error_code, second.generation_id, second.leader) == (0, 1, second.member_id), second
        assert second.member_id != first.member_id and second.skip_assignment
        assert (await client.request(static_heartbeat(1, first.member_id))).error_code == FENCED_INSTANCE_ID
        resynced = await static_sync(client, 1, second.member_id, None)
        assert (resynced.error_code, bytes(resynced.assignment)) == (0, b"partitions-0-1")
        await client.close()
        assert await running.terminate() == 0

    async with service(kafka_bootstrap, state_topic, *FAST) as restarted:
        probe = await restarted.client()
        described = await until_loaded(probe, STATIC_GROUP)
        assert described.group_state == "Stable"
        assert [(m.member_id, m.group_instance_id) for m in described.members] == [(second.member_id, INSTANCE)]
        client, _ = await static_client(restarted.port)
        third = await static_join(client)
        assert (third.error_code, third.generation_id, third.leader) == (0, 1, third.member_id), third
        resynced = await static_sync(client, 1, third.member_id, None)
        assert (resynced.error_code, bytes(resynced.assignment)) == (0, b"partitions-0-1")
        assert (await describe(probe, STATIC_GROUP)).group_state == "Stable"
        for each in (client, probe):
            await each.close()
