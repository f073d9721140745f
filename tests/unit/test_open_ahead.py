"""The state write opened ahead of a rebalance's assignment: the store is told when a group's join completes
(before its leader's SyncGroup), once per generation, for the group's partition; a load skips the marker that
opened the transaction without counting or logging it (coordinator/storage/loader.py)."""
from __future__ import annotations

import logging

import pytest

from coordinator.group.store import InMemoryGroupStore
from coordinator.storage.loader import StateReplay
from coordinator.storage.records import OPEN_AHEAD_KEY, GroupMetadataKey, decode_key, encode_key
from tests.support.group_harness import Env, advance_until_joined, complete_rebalance, drain


class ExpectingStore(InMemoryGroupStore):
    def __init__(self) -> None:
        super().__init__()
        self.expected: list[tuple[int, int]] = []  # (partition, writes made before)

    def expect_append(self, partition: int) -> None:
        self.expected.append((partition, len(self.writes)))


async def test_the_store_is_told_of_the_assignment_write_when_the_join_completes() -> None:
    store = ExpectingStore()
    env = Env(store=store)
    try:
        a, b = env.client("a"), env.client("b")
        for client in (a, b):
            await client.start_join()
        assert store.expected == []  # the join phase is not over: nothing is expected yet
        await advance_until_joined(env, a, b)
        partition = env.coordinator.partition_for("g")
        assert store.expected == [(partition, 0)]  # before any write: the leader has not assigned yet
        await complete_rebalance(env, a, b)
        await drain()
        assert store.expected == [(partition, 0)] and len(store.writes) == 1

        for client in (a, b):  # the next generation: told again
            await client.start_join()
        await advance_until_joined(env, a, b)
        assert store.expected == [(partition, 0), (partition, 1)]
    finally:
        await env.close()


def test_a_load_skips_the_marker_quietly(caplog: pytest.LogCaptureFixture) -> None:
    assert decode_key(OPEN_AHEAD_KEY).version < 0  # never one of Kafka's record types
    replay = StateReplay()
    with caplog.at_level(logging.WARNING, logger="coordinator.storage"):
        replay.apply(OPEN_AHEAD_KEY, None)
        replay.apply(encode_key(GroupMetadataKey("g")), None)
    assert (replay.state.records, replay.state.unknown_records, replay.state.malformed_records) == (2, 0, 0)
    assert caplog.text == ""
