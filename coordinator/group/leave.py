"""LeaveGroup (§3.4) as a function of (shard, request): members leave at once (a rebalance follows), KIP-345
admin removals by group.instance.id included."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from coordinator.group.api import (UNKNOWN_MEMBER_ID, LeaveGroupRequest, LeaveGroupResponse,
                                   LeaveGroupResponseMember, MemberIdentity)
from coordinator.group.delayed import member_key
from coordinator.group.observer import RebalanceCategory, RebalanceCause
from coordinator.group.state import DEAD
from protocol.error_codes import Errors

if TYPE_CHECKING:
    from coordinator.group.metadata import GroupMetadata
    from coordinator.group.shard import GroupShard

log = logging.getLogger("coordinator.group")


def handle_leave_group(shard: GroupShard, req: LeaveGroupRequest) -> LeaveGroupResponse:
    error = shard.group_status_error(req.group_id)
    if error is not None:
        return LeaveGroupResponse(error)
    group = shard.groups.get(req.group_id)
    if group is None:
        return LeaveGroupResponse(Errors.NONE, [_leave_result(m, Errors.UNKNOWN_MEMBER_ID) for m in req.members])
    if group.is_in(DEAD):
        return LeaveGroupResponse(Errors.COORDINATOR_NOT_AVAILABLE)
    return LeaveGroupResponse(Errors.NONE, [_leave_result(m, _leave_one(shard, group, m)) for m in req.members])


def _leave_one(shard: GroupShard, group: GroupMetadata, leaving: MemberIdentity) -> Errors:
    reason = leaving.reason or "not provided"
    if leaving.member_id == UNKNOWN_MEMBER_ID:  # KIP-345 admin removal by group.instance.id
        current = group.current_static_member_id(leaving.group_instance_id)
        if current is None:
            return Errors.UNKNOWN_MEMBER_ID
        _remove_leaving_member(shard, group, current, reason)
        return Errors.NONE
    if leaving.member_id in group.pending_members:
        shard.remove_pending_member_and_update_group(group, leaving.member_id)
        shard.heartbeat_purgatory.check_and_complete(member_key(group.group_id, leaving.member_id))
        log.info("event=pending_member_left group=%s member=%s reason=%r", group.group_id, leaving.member_id,
                 reason)
        return Errors.NONE
    error = shard.validate_current_member(group, leaving.member_id, leaving.group_instance_id, "leave-group")
    if error is not None:
        return error
    _remove_leaving_member(shard, group, leaving.member_id, reason)
    return Errors.NONE


def _remove_leaving_member(shard: GroupShard, group: GroupMetadata, member_id: str, reason: str) -> None:
    member = group.get(member_id)
    log.info("event=member_left group=%s member=%s group_instance_id=%s reason=%r",
             group.group_id, member_id, member.group_instance_id, reason)
    cause = RebalanceCause(RebalanceCategory.MEMBER_LEFT,
                           f"Removing member {member_id} on LeaveGroup; client reason: {reason}", member_id, reason)
    if shard.rebalances_on_removal(group):
        shard.announce_rebalance(group, cause)
    shard.observer.on_member_left(group.group_id, member_id, member.group_instance_id, reason)
    shard.remove_member_and_update_group(group, member, cause)
    shard.remove_heartbeat(group, member)


def _leave_result(member: MemberIdentity, error: Errors) -> LeaveGroupResponseMember:
    return LeaveGroupResponseMember(member.member_id, member.group_instance_id, error)
