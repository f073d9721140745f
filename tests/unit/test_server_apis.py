"""Every served API at its lowest and highest version, through our client against the real GroupRuntime."""

from __future__ import annotations

import pytest

from coordinator.server.handlers import SERVED_APIS
from protocol.apis import ApiKey
from tests.support.server import RunningServer
from tests.support.wire import heartbeat, join, join_with_member_id, ms, nested, request, sync

LOW = {key: api.min_version for key, api in SERVED_APIS.items()}
HIGH = {key: api.max_version for key, api in SERVED_APIS.items()}


@pytest.mark.parametrize("api_version", range(0, 5))
async def test_api_versions_lists_the_served_table_at_every_version(api_version: int) -> None:
    async with RunningServer() as env:
        client = await env.client(negotiate=False)
        response = await client.request(request(ApiKey.API_VERSIONS, api_version, client_software_name="t",
                                                client_software_version="1"))
        assert response.error_code == 0
        listed = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}
        assert listed == {key: (api.min_version, api.max_version) for key, api in SERVED_APIS.items()}


async def test_api_versions_v3_with_a_bad_software_name_is_invalid_request() -> None:
    async with RunningServer() as env:
        client = await env.client(negotiate=False)
        response = await client.request(request(ApiKey.API_VERSIONS, 3, client_software_name="-bad name",
                                                client_software_version="1"))
        assert response.error_code == 42 and response.api_keys == ()


@pytest.mark.parametrize("versions", [LOW, HIGH], ids=["lowest", "highest"])
async def test_metadata_and_find_coordinator_point_at_this_node(versions: dict[int, int]) -> None:
    async with RunningServer(node_id=7, advertised_host="coordinator.example", advertised_port=19092) as env:
        client = await env.client()
        v = versions[ApiKey.METADATA]
        topic = nested(ApiKey.METADATA, v, "topics")
        topic_fields = {"name": "orders", "topic_id": None}
        metadata = await client.request(request(ApiKey.METADATA, v, topics=(topic(**{
            k: val for k, val in topic_fields.items() if k in topic.__dataclass_fields__}),),
            allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False))
        assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [(7, "coordinator.example", 19092)]
        assert [(t.name, int(t.error_code)) for t in metadata.topics] == [("orders", 3)]

        v = versions[ApiKey.FIND_COORDINATOR]
        if v >= 4:
            found = await client.request(request(ApiKey.FIND_COORDINATOR, v, key_type=0,
                                                 coordinator_keys=("g1", "g2")))
            assert [(c.key, c.node_id, c.host, c.port, c.error_code) for c in found.coordinators] == [
                ("g1", 7, "coordinator.example", 19092, 0), ("g2", 7, "coordinator.example", 19092, 0)]
            txn = await client.request(request(ApiKey.FIND_COORDINATOR, v, key_type=1, coordinator_keys=("tx",)))
            assert [(c.error_code, c.node_id) for c in txn.coordinators] == [(15, -1)]
        else:
            found = await client.request(request(ApiKey.FIND_COORDINATOR, v, key="g1", key_type=0))
            assert (found.error_code, found.node_id, found.host, found.port) == (0, 7, "coordinator.example", 19092)


async def test_find_coordinator_transaction_key_is_not_available() -> None:
    async with RunningServer() as env:
        client = await env.client()
        found = await client.request(request(ApiKey.FIND_COORDINATOR, 3, key="tx", key_type=1))
        assert (found.error_code, found.node_id, found.host, found.port) == (15, -1, "", -1)


@pytest.mark.parametrize("versions", [LOW, HIGH], ids=["lowest", "highest"])
async def test_a_group_lifecycle_at_one_end_of_every_range(versions: dict[int, int]) -> None:
    async with RunningServer() as env:
        client = await env.client(client_id="lifecycle")
        joined = await join_with_member_id(client, "g", version=versions[ApiKey.JOIN_GROUP])
        assert joined.error_code == 0 and joined.generation_id == 1 and joined.leader == joined.member_id
        member = joined.member_id
        synced = await sync(client, "g", 1, member, {member: b"assignment"}, version=versions[ApiKey.SYNC_GROUP])
        assert synced.error_code == 0 and synced.assignment == b"assignment"
        beat = await client.request(heartbeat("g", 1, member, version=versions[ApiKey.HEARTBEAT]))
        assert beat.error_code == 0
        assert (await client.request(heartbeat("g", 2, member, versions[ApiKey.HEARTBEAT]))).error_code == 22

        await _commit_and_fetch(client, member, versions[ApiKey.OFFSET_COMMIT], versions[ApiKey.OFFSET_FETCH])
        await _delete_offsets_of_a_stable_group(client, versions[ApiKey.OFFSET_DELETE])
        await _describe_and_list(client, member, versions[ApiKey.DESCRIBE_GROUPS], versions[ApiKey.LIST_GROUPS])
        await _leave_and_delete(client, member, versions[ApiKey.LEAVE_GROUP], versions[ApiKey.DELETE_GROUPS])


async def _commit_and_fetch(client, member: str, commit_version: int, fetch_version: int) -> None:
    partition = nested(ApiKey.OFFSET_COMMIT, commit_version, "topics", "partitions")
    topic = nested(ApiKey.OFFSET_COMMIT, commit_version, "topics")
    partition_fields = dict(partition_index=0, committed_offset=42, committed_leader_epoch=3,
                            committed_metadata="meta")
    committed = await client.request(request(
        ApiKey.OFFSET_COMMIT, commit_version, group_id="g", generation_id_or_member_epoch=1, member_id=member,
        group_instance_id=None, retention_time=ms(-1),
        topics=(topic(name="t", partitions=(partition(**{k: v for k, v in partition_fields.items()
                                                           if k in partition.__dataclass_fields__}),)),)))
    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in committed.topics] == [
        ("t", [(0, 0)])]

    fetch_topic = nested(ApiKey.OFFSET_FETCH, fetch_version, "groups", "topics") if fetch_version >= 8 else \
        nested(ApiKey.OFFSET_FETCH, fetch_version, "topics")
    topics = (fetch_topic(name="t", partition_indexes=(0, 1)),)
    if fetch_version >= 8:
        group = nested(ApiKey.OFFSET_FETCH, fetch_version, "groups")
        fetched = await client.request(request(ApiKey.OFFSET_FETCH, fetch_version, groups=(
            group(group_id="g", member_id=None, member_epoch=-1, topics=topics),
            group(group_id="other", member_id=None, member_epoch=-1, topics=topics)), require_stable=False))
        assert [g.group_id for g in fetched.groups] == ["g", "other"]
        answered, other = fetched.groups[0].topics, fetched.groups[1].topics
        assert [p.committed_offset for p in other[0].partitions] == [-1, -1]
    else:
        answered = (await client.request(request(ApiKey.OFFSET_FETCH, fetch_version, group_id="g", topics=topics,
                                                 require_stable=False))).topics
    offsets = [(p.partition_index, p.committed_offset, p.metadata, p.error_code) for p in answered[0].partitions]
    assert offsets == [(0, 42, "meta", 0), (1, -1, "", 0)]


async def _delete_offsets_of_a_stable_group(client, version: int) -> None:
    """The member subscribes to "t": its offsets stay; a topic it does not consume is deleted."""
    topic = nested(ApiKey.OFFSET_DELETE, version, "topics")
    partition = nested(ApiKey.OFFSET_DELETE, version, "topics", "partitions")
    deleted = await client.request(request(ApiKey.OFFSET_DELETE, version, group_id="g", topics=(
        topic(name="t", partitions=(partition(partition_index=0),)),
        topic(name="u", partitions=(partition(partition_index=0),)))))
    assert deleted.error_code == 0
    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in deleted.topics] == [
        ("t", [(0, 86)]), ("u", [(0, 0)])]


async def _describe_and_list(client, member: str, describe_version: int, list_version: int) -> None:
    described = await client.request(request(ApiKey.DESCRIBE_GROUPS, describe_version, groups=("g", "nope"),
                                             include_authorized_operations=False))
    group, unknown = described.groups
    assert (group.error_code, group.group_state, group.protocol_type, group.protocol_data) == (
        0, "Stable", "consumer", "range")
    assert [(m.member_id, m.client_id, m.client_host, m.member_assignment) for m in group.members] == [
        (member, "lifecycle", "/127.0.0.1", b"assignment")]
    assert (unknown.error_code, unknown.group_state) == (0, "Dead")
    listed = await client.request(request(ApiKey.LIST_GROUPS, list_version, states_filter=(), types_filter=()))
    assert listed.error_code == 0
    assert [(g.group_id, g.protocol_type) for g in listed.groups] == [("g", "consumer")]
    if list_version >= 4:
        assert [g.group_state for g in listed.groups] == ["Stable"]


async def _leave_and_delete(client, member: str, leave_version: int, delete_version: int) -> None:
    if leave_version >= 3:
        identity = nested(ApiKey.LEAVE_GROUP, leave_version, "members")
        left = await client.request(request(ApiKey.LEAVE_GROUP, leave_version, group_id="g", members=(
            identity(member_id=member, group_instance_id=None, reason="done"),)))
        assert [(m.member_id, m.error_code) for m in left.members] == [(member, 0)]
    else:
        left = await client.request(request(ApiKey.LEAVE_GROUP, leave_version, group_id="g", member_id=member))
    assert left.error_code == 0
    deleted = await client.request(request(ApiKey.DELETE_GROUPS, delete_version, groups_names=("g", "g", "nope")))
    assert [(r.group_id, r.error_code) for r in deleted.results] == [("g", 0), ("nope", 69)]


async def test_join_group_v0_uses_the_session_timeout_as_rebalance_timeout() -> None:
    async with RunningServer() as env:
        client = await env.client()
        joined = await join(client, "g0", version=0, session_timeout_ms=7_000)
        assert joined.error_code == 0
        assert env.coordinator.groups["g0"].members[joined.member_id].rebalance_timeout_ms == 7_000


async def test_sync_group_v5_without_protocol_names_is_inconsistent_protocol() -> None:
    async with RunningServer() as env:
        client = await env.client()
        joined = await join_with_member_id(client, "g")
        body = request(ApiKey.SYNC_GROUP, 5, group_id="g", generation_id=1, member_id=joined.member_id,
                       group_instance_id=None, protocol_type=None, protocol_name=None, assignments=())
        assert (await client.request(body)).error_code == 23
