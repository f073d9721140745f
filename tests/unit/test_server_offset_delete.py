"""OffsetDelete v0 over the wire: our client against the real GroupRuntime behind the CoordinatorServer."""

from __future__ import annotations

from protocol.apis import ApiKey
from tests.support.server import RunningServer
from tests.support.wire import join_with_member_id, ms, nested, request, sync

VERSION = 0


def offset_delete(group_id: str, partitions: dict[str, tuple[int, ...]]):
    topic = nested(ApiKey.OFFSET_DELETE, VERSION, "topics")
    partition = nested(ApiKey.OFFSET_DELETE, VERSION, "topics", "partitions")
    return request(ApiKey.OFFSET_DELETE, VERSION, group_id=group_id, topics=tuple(
        topic(name=name, partitions=tuple(partition(partition_index=i) for i in indexes))
        for name, indexes in partitions.items()))


async def commit(client, group_id: str, generation_id: int, member_id: str, partitions: dict[str, tuple[int, ...]]):
    topic = nested(ApiKey.OFFSET_COMMIT, 9, "topics")
    partition = nested(ApiKey.OFFSET_COMMIT, 9, "topics", "partitions")
    committed = await client.request(request(
        ApiKey.OFFSET_COMMIT, 9, group_id=group_id, generation_id_or_member_epoch=generation_id,
        member_id=member_id, group_instance_id=None, retention_time=ms(-1),
        topics=tuple(topic(name=name, partitions=tuple(
            partition(partition_index=i, committed_offset=100 + i, committed_leader_epoch=-1, committed_metadata="")
            for i in indexes)) for name, indexes in partitions.items())))
    assert all(p.error_code == 0 for t in committed.topics for p in t.partitions)


async def fetched(client, group_id: str, partitions: dict[str, tuple[int, ...]]) -> dict[tuple[str, int], int]:
    topic = nested(ApiKey.OFFSET_FETCH, 7, "topics")
    response = await client.request(request(ApiKey.OFFSET_FETCH, 7, group_id=group_id, require_stable=False,
                                            topics=tuple(topic(name=n, partition_indexes=ps)
                                                         for n, ps in partitions.items())))
    return {(t.name, p.partition_index): p.committed_offset for t in response.topics for p in t.partitions}


def answered(response) -> list[tuple[str, list[tuple[int, int]]]]:
    return [(t.name, [(p.partition_index, int(p.error_code)) for p in t.partitions]) for t in response.topics]


async def test_offset_delete_round_trip_for_an_empty_group() -> None:
    async with RunningServer() as env:
        client = await env.client()
        await commit(client, "simple", -1, "", {"t": (0, 1), "u": (0,)})
        deleted = await client.request(offset_delete("simple", {"t": (0,), "u": (0, 7)}))
        assert (int(deleted.error_code), answered(deleted)) == (0, [("t", [(0, 0)]), ("u", [(0, 0), (7, 0)])])
        assert await fetched(client, "simple", {"t": (0, 1), "u": (0,)}) == {
            ("t", 0): -1, ("t", 1): 101, ("u", 0): -1}
        assert set(env.store.offsets["simple"]) == {("t", 1)}
        # The last offset gone: the Empty group is removed, and asking again finds no group.
        assert answered(await client.request(offset_delete("simple", {"t": (1,)}))) == [("t", [(1, 0)])]
        assert "simple" not in env.coordinator.groups and "simple" not in env.store.offsets
        again = await client.request(offset_delete("simple", {"t": (1,)}))
        assert (int(again.error_code), again.topics) == (69, ())


async def test_offset_delete_round_trip_for_a_stable_consumer_group() -> None:
    async with RunningServer() as env:
        client = await env.client()
        joined = await join_with_member_id(client, "g", topics=("t",))
        member = joined.member_id
        assert (await sync(client, "g", joined.generation_id, member, {member: b"a"})).error_code == 0
        await commit(client, "g", joined.generation_id, member, {"t": (0,), "gone": (0, 1)})
        deleted = await client.request(offset_delete("g", {"t": (0,), "gone": (0, 1)}))
        assert (int(deleted.error_code), answered(deleted)) == (0, [("t", [(0, 86)]), ("gone", [(0, 0), (1, 0)])])
        assert await fetched(client, "g", {"t": (0,), "gone": (0, 1)}) == {
            ("t", 0): 100, ("gone", 0): -1, ("gone", 1): -1}
        no_id = await client.request(offset_delete("", {"t": (0,)}))
        assert (int(no_id.error_code), no_id.topics) == (24, ())  # INVALID_GROUP_ID
