"""What a user pointing real tools at `coordinator serve` meets: librdkafka's AdminClient managing groups and
offsets (and the result surviving a restart), a librdkafka consumer living in a group, aiokafka's coordinator
lookup, and a static member (ApiVersions v4, JoinGroup v9) restarting against a restarting coordinator."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka.admin import AdminClient

from protocol.apis import ApiKey
from tests.support.admin import (admin_alter_offsets, admin_delete_group, admin_describe_group, admin_list_groups,
                                 admin_list_offsets)
from tests.support.service import FAST, describe, fetch_offsets, service, unique, until_loaded
from tests.support.static_member import (FENCED_INSTANCE_ID, INSTANCE, STATIC_GROUP, static_client, static_heartbeat,
                                         static_join, static_sync)


async def test_admin_client_manages_groups_and_offsets_across_a_restart(kafka_bootstrap: str) -> None:
    state_topic = unique("__state")
    kept, deleted = "tools-kept", "tools-deleted"
    async with service(kafka_bootstrap, state_topic, *FAST) as running:
        probe = await running.client()
        await until_loaded(probe)
        port = running.port
        run = asyncio.to_thread
        assert await run(admin_alter_offsets, port, kept, {0: 5, 1: 6}) == [(0, 5, None), (1, 6, None)]
        assert await run(admin_alter_offsets, port, deleted, {0: 7}) == [(0, 7, None)]
        assert await run(admin_list_offsets, port, kept, (0, 1, 2)) == {0: 5, 1: 6, 2: -1001}
        assert await run(admin_list_groups, port) == {kept: "EMPTY", deleted: "EMPTY"}
        described = await run(admin_describe_group, port, kept)
        assert (described.state.name, described.members, described.coordinator.port) == ("EMPTY", [], port)
        assert await run(admin_delete_group, port, deleted) is None
        assert await run(admin_delete_group, port, deleted) == "GROUP_ID_NOT_FOUND"
        assert await run(admin_list_groups, port) == {kept: "EMPTY"}
        await probe.close()
        assert await running.terminate() == 0

    async with service(kafka_bootstrap, state_topic, *FAST) as restarted:
        probe = await restarted.client()
        await until_loaded(probe)
        assert await asyncio.to_thread(admin_list_groups, restarted.port) == {kept: "EMPTY"}
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
