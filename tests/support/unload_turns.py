"""Unloads measured by loop turn: classic group records to load, and the groups unloaded in each loop turn."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from coordinator.group.metadata import GroupMetadata
from coordinator.group.records import GroupRecord, MemberRecord
from coordinator.group.shard import GroupShard
from protocol.error_codes import Errors
from tests.support.group_harness import Client, Env, subscription

SESSION_MS = 10_000


def group_records(groups: int | Iterable[str], now_ms: int, size: int = 3) -> dict[str, GroupRecord]:
    """Stable classic groups of `size` members each (`groups`: their ids, or how many, named group-0, group-1...),
    subscribed to "orders", with a session of SESSION_MS."""
    group_ids = [f"group-{g}" for g in range(groups)] if isinstance(groups, int) else list(groups)
    records = {}
    for group_id in group_ids:
        members = [MemberRecord(f"{group_id}-member-{m}", None, "client", "/127.0.0.1", 30_000, SESSION_MS,
                                subscription("orders"), b"assignment") for m in range(size)]
        records[group_id] = GroupRecord("consumer", 1, "range", members[0].member_id, now_ms, members)
    return records


class Turns:
    """The groups unloaded in each loop turn (`GroupShard.unload_group` counted; a ticker rescheduled every turn
    closes each turn and runs `each_turn` first)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, each_turn: Callable[[int], None]) -> None:
        self.unloaded: list[int] = [0]
        self._each_turn = each_turn
        unload_group = GroupShard.unload_group

        def counted(shard: GroupShard, group: GroupMetadata, error: Errors = Errors.NOT_COORDINATOR) -> None:
            self.unloaded[-1] += 1
            unload_group(shard, group, error)

        monkeypatch.setattr(GroupShard, "unload_group", counted)
        self._loop = asyncio.get_running_loop()
        self._ticker = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        if self.unloaded[-1]:
            self._each_turn(len(self.unloaded))
            self.unloaded.append(0)
        self._ticker = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._ticker.cancel()


async def parked_joins(env: Env, group_ids: list[str]) -> list[asyncio.Task[Any]]:
    """A new member joins each group: the group prepares a rebalance and its JoinGroup is parked until the loaded
    members rejoin (or their rebalance timeout runs out)."""
    joins = []
    for group_id in group_ids:
        joins.append(await Client(env, f"new-{group_id}", group_id, session_timeout_ms=SESSION_MS).start_join())
    assert not any(join.done() for join in joins)
    return joins
