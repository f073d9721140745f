"""The TxnOffsetCommit handler's answers that need no cluster: the shard's status per partition, no relay (no
transaction coordinator: nothing to append to), metadata too large, each version's response shape; on a real
runtime with the in-memory store and a manual clock. The appends themselves are tested against the embedded broker
(tests/integration/test_txn_offset_commit_handler.py)."""
from __future__ import annotations

from typing import Any

import pytest

from coordinator.group.status import ShardStatus
from coordinator.server.context import ConnectionContext, Node
from coordinator.server.handlers import HANDLERS, served_ranges
from coordinator.server.handlers.txn_offset_commit import API_KEY, VERSIONS, handle
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from tests.support.group_harness import Env, env  # noqa: F401
from tests.support.wire import nested, request


def body(version: int, group: str, offsets: dict[tuple[str, int], int], metadata: str = "") -> Any:
    partition_class = nested(API_KEY, version, "topics", "partitions")
    topics: dict[str, list[Any]] = {}
    for (topic, partition), offset in offsets.items():
        fields = {"partition_index": partition, "committed_offset": offset, "committed_leader_epoch": -1,
                  "committed_metadata": metadata}
        topics.setdefault(topic, []).append(partition_class(**{
            k: v for k, v in fields.items() if k in partition_class.__dataclass_fields__}))
    return request(API_KEY, version, transactional_id="app", group_id=group, producer_id=7, producer_epoch=0,
                   generation_id=-1, member_id="", group_instance_id=None,
                   topics=tuple(nested(API_KEY, version, "topics")(name=name, partitions=tuple(parts))
                                for name, parts in topics.items()))


async def answered(env: Env, version: int, group: str, offsets: dict[tuple[str, int], int],
                   metadata: str = "") -> dict[tuple[str, int], Errors]:
    ctx = ConnectionContext(node=Node(1, "127.0.0.1", 9092, "c"), coordinator=env.coordinator,
                            client_host="/127.0.0.1", peer="test")
    answer = await handle(ctx, RequestHeader(int(API_KEY), version, 1, "t"), body(version, group, offsets, metadata))
    return {(t.name, int(p.partition_index)): Errors(int(p.error_code)) for t in answer.topics for p in t.partitions}


def test_served_and_advertised_at_kafkas_versions() -> None:
    assert VERSIONS == (0, 5) and served_ranges()[28] == (0, 5) and HANDLERS[28] is handle


@pytest.mark.parametrize("version", range(6))
async def test_the_shards_status_answers_every_partition(env: Env, version: int) -> None:  # noqa: F811
    offsets = {("a", 0): 1, ("a", 1): 2, ("b", 0): 3}
    for status, error in ((ShardStatus.LOADING, Errors.COORDINATOR_LOAD_IN_PROGRESS),
                          (ShardStatus.UNOWNED, Errors.NOT_COORDINATOR),
                          (ShardStatus.STOPPED, Errors.COORDINATOR_NOT_AVAILABLE)):
        env.set_status(status, "g")
        assert await answered(env, version, "g", offsets) == dict.fromkeys(offsets, error)
    env.set_status(ShardStatus.ACTIVE, "g")
    assert await answered(env, version, "", offsets) == dict.fromkeys(offsets, Errors.INVALID_GROUP_ID)


async def test_without_the_relay_nothing_is_appended_and_no_group_is_left(env: Env) -> None:  # noqa: F811
    """No relay: no client can have a transaction coordinator, so nothing settles our partition's offsets."""
    assert await answered(env, 3, "g", {("a", 0): 1}) == {("a", 0): Errors.COORDINATOR_NOT_AVAILABLE}
    assert "g" not in env.coordinator.groups  # the group the validation made for it goes again
    assert not env.coordinator.shard_for("g").transactional_offsets.has_open_transactions("g")


async def test_metadata_too_large_is_answered_per_partition(env: Env) -> None:  # noqa: F811
    long = "m" * 4_097  # offset.metadata.max.bytes is 4096
    assert await answered(env, 2, "g", {("a", 0): 1, ("a", 1): 2}, metadata=long) == {
        ("a", 0): Errors.OFFSET_METADATA_TOO_LARGE, ("a", 1): Errors.OFFSET_METADATA_TOO_LARGE}
