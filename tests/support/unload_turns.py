"""Unloads measured by loop turn: classic group records to load, and the groups unloaded in each loop turn."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from coordinator.group.records import GroupRecord, MemberRecord
from coordinator.group.state import DEAD
from tests.support.group_harness import Client, Env, RecordingObserver, subscription

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
    """The groups unloaded in each loop turn: each goes Dead in the unload funnel (`GroupShard.unload_group`), which
    the observer hears as its state change (nothing else makes a group Dead in these tests); a ticker rescheduled
    every turn closes each turn and runs `each_turn` first."""

    def __init__(self, observer: RecordingObserver, each_turn: Callable[[int], None]) -> None:
        self.unloaded: list[int] = [0]
        self._each_turn = each_turn
        self._events = observer.events
        self._seen = len(self._events)
        self._loop = asyncio.get_running_loop()
        self._ticker = self._loop.call_soon(self._tick)

    def _count(self) -> None:
        events, seen = self._events, self._seen
        self.unloaded[-1] += sum(1 for event in events[seen:] if event[0] == "state" and event[3] == DEAD.value)
        self._seen = len(events)

    def _tick(self) -> None:
        self._count()
        if self.unloaded[-1]:
            self._each_turn(len(self.unloaded))
            self.unloaded.append(0)
        self._ticker = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._ticker.cancel()
        self._count()


async def parked_joins(env: Env, group_ids: list[str]) -> list[asyncio.Task[Any]]:
    """A new member joins each group: the group prepares a rebalance and its JoinGroup is parked until the loaded
    members rejoin (or their rebalance timeout runs out)."""
    joins = []
    for group_id in group_ids:
        joins.append(await Client(env, f"new-{group_id}", group_id, session_timeout_ms=SESSION_MS).start_join())
    assert not any(join.done() for join in joins)
    return joins
