"""Heartbeat (§3.3) as a function of (shard, request): the hot path, no writes."""
from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.group.status import ShardStatus
from coordinator.group.state import DEAD, EMPTY, PREPARING
from protocol.error_codes import Errors

if TYPE_CHECKING:
    from coordinator.group.shard import GroupShard

ACTIVE = ShardStatus.ACTIVE


def handle_heartbeat(shard: GroupShard, group_id: str, generation_id: int, member_id: str,
                     group_instance_id: str | None = None) -> Errors:
    """The hot path: dict lookups and one deadline move. Synchronous, for the wire layer's fast path."""
    group = shard.groups.get(group_id)
    if group is None or shard.status is not ACTIVE or not group_id:
        error = shard.group_status_error(group_id)
        if error is not None:
            return Errors.NONE if error == Errors.COORDINATOR_LOAD_IN_PROGRESS else error
        if group is None:
            return Errors.UNKNOWN_MEMBER_ID
    state = group.state
    if state is DEAD:
        return Errors.COORDINATOR_NOT_AVAILABLE
    member = group.members.get(member_id)
    if group_instance_id is not None or member is None:
        error = shard.validate_current_member(group, member_id, group_instance_id, "heartbeat")
        if error is not None:
            return error
        member = group.members[member_id]
    if generation_id != group.generation_id:
        return Errors.ILLEGAL_GENERATION
    if state is EMPTY:
        return Errors.UNKNOWN_MEMBER_ID
    shard.schedule_heartbeat(group, member, member.session_timeout_ms)
    shard.heartbeat_count += 1
    if state is PREPARING:
        shard.observer.on_rebalance_in_progress(group_id, member_id, "Heartbeat")
        return Errors.REBALANCE_IN_PROGRESS
    return Errors.NONE
