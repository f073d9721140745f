"""The group protocol's delayed operations: identity holders that delegate to the shard.

Keys (Kafka's `MemberKey`, `GroupJoinKey`, `GroupSyncKey`) are tuples so they hash cheaply and never collide.
"""
from __future__ import annotations

from typing import Callable, Protocol

from coordinator.group.metadata import GroupMetadata
from coordinator.group.state import GroupState
from coordinator.purgatory import DelayedOperation, DelayedOperationPurgatory


class JoinTimers(Protocol):
    """What a DelayedJoin delegates to (the shard: group/shard.py)."""

    def try_complete_join(self, group: GroupMetadata, force_complete: Callable[[], bool]) -> bool: ...

    def on_complete_join(self, group: GroupMetadata) -> None: ...


class HeartbeatTimers(Protocol):
    """What a DelayedHeartbeat delegates to (session tracking: group/sessions.py)."""

    def try_complete_heartbeat(self, op: DelayedHeartbeat) -> bool: ...

    def on_expire_heartbeat(self, op: DelayedHeartbeat) -> None: ...

    def postponed_heartbeat_ms(self, op: DelayedHeartbeat, expiration_ms: int) -> int: ...


class SyncTimers(Protocol):
    """What a DelayedSync delegates to (the shard)."""

    def try_complete_pending_sync(self, group: GroupMetadata, generation_id: int,
                                  force_complete: Callable[[], bool]) -> bool: ...

    def on_expire_pending_sync(self, group: GroupMetadata, generation_id: int) -> None: ...


def member_key(group_id: str, member_id: str) -> tuple[str, str, str]:
    return ("member", group_id, member_id)


def join_key(group_id: str) -> tuple[str, str]:
    return ("join", group_id)


def sync_key(group_id: str) -> tuple[str, str]:
    return ("sync", group_id)


class DelayedJoin(DelayedOperation):
    """Completes when every known member has re-joined (and no KIP-394 member is pending), or at the
    rebalance timeout."""

    __slots__ = ("shard", "group")

    def __init__(self, shard: JoinTimers, group: GroupMetadata, rebalance_timeout_ms: int) -> None:
        super().__init__(rebalance_timeout_ms)
        self.shard, self.group = shard, group

    def try_complete(self) -> bool:
        return self.shard.try_complete_join(self.group, self.force_complete)

    def on_complete(self) -> None:
        self.shard.on_complete_join(self.group)

    def on_expiration(self) -> None:
        pass


class InitialDelayedJoin(DelayedJoin):
    """The first rebalance of an Empty group waits `group.initial.rebalance.delay.ms`, extended window by
    window while new members keep arriving, up to the first members' rebalance timeout. Never completes
    early, unless the group is unloaded."""

    __slots__ = ("purgatory", "configured_delay_ms", "remaining_ms")

    def __init__(self, shard: JoinTimers, purgatory: DelayedOperationPurgatory[DelayedOperation],
                 group: GroupMetadata,
                 configured_delay_ms: int, delay_ms: int, remaining_ms: int) -> None:
        super().__init__(shard, group, delay_ms)
        self.purgatory = purgatory
        self.configured_delay_ms = configured_delay_ms
        self.remaining_ms = remaining_ms

    def try_complete(self) -> bool:
        return self.group.is_in(GroupState.DEAD) and self.force_complete()  # only an unload cuts it short

    def on_complete(self) -> None:
        group = self.group
        if group.new_member_added and self.remaining_ms != 0 and not group.is_in(GroupState.DEAD):
            group.new_member_added = False
            delay_ms = min(self.configured_delay_ms, self.remaining_ms)
            remaining_ms = max(self.remaining_ms - self.delay_ms, 0)
            self.purgatory.try_complete_else_watch(
                InitialDelayedJoin(self.shard, self.purgatory, group, self.configured_delay_ms, delay_ms,
                                   remaining_ms),
                [join_key(group.group_id)],
            )
        else:
            self.shard.on_complete_join(group)


class DelayedHeartbeat(DelayedOperation):
    """A member's session deadline (or, `is_pending`, a KIP-394 pending member's expiry)."""

    __slots__ = ("shard", "group", "member_id", "is_pending", "deadline_ms")

    def __init__(self, shard: HeartbeatTimers, group: GroupMetadata, member_id: str, is_pending: bool,
                 timeout_ms: int, now_ms: int) -> None:
        super().__init__(timeout_ms)
        self.shard, self.group = shard, group
        self.member_id, self.is_pending = member_id, is_pending
        self.deadline_ms = now_ms + timeout_ms

    def try_complete(self) -> bool:
        return self.shard.try_complete_heartbeat(self)

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        self.shard.on_expire_heartbeat(self)

    postponable = True  # heartbeats move the session deadline without touching the timer

    def postponed_ms(self, expiration_ms: int) -> int:
        return self.shard.postponed_heartbeat_ms(self, expiration_ms)


class DelayedSync(DelayedOperation):
    """Members that got a JoinGroup response must send SyncGroup within the rebalance timeout."""

    __slots__ = ("shard", "group", "generation_id")

    def __init__(self, shard: SyncTimers, group: GroupMetadata, generation_id: int,
                 rebalance_timeout_ms: int) -> None:
        super().__init__(rebalance_timeout_ms)
        self.shard, self.group, self.generation_id = shard, group, generation_id

    def try_complete(self) -> bool:
        return self.shard.try_complete_pending_sync(self.group, self.generation_id, self.force_complete)

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        self.shard.on_expire_pending_sync(self.group, self.generation_id)
