"""SyncGroup (§3.2) as a function of (shard, request). The leader's SyncGroup returns the group record to
append; every parked SyncGroup is answered once it is written. Heartbeat: heartbeat.py; LeaveGroup: leave.py."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from coordinator.group.api import SyncGroupRequest, SyncGroupResponse
from coordinator.group.errors import group_append_error
from coordinator.group.observer import RebalanceCategory, RebalanceCause
from coordinator.group.result import Result, Write
from protocol.error_codes import Errors
from coordinator.group.state import COMPLETING, DEAD, EMPTY, PREPARING, STABLE

if TYPE_CHECKING:
    from coordinator.group.shard import GroupShard
    from coordinator.group.metadata import GroupMetadata

log = logging.getLogger("coordinator.group")
_NONE = Errors.NONE  # a global: an Enum class attribute costs ten times as much (a late SyncGroup reads it)

def handle_sync_group(shard: GroupShard, req: SyncGroupRequest
                      ) -> Result[SyncGroupResponse] | asyncio.Future[SyncGroupResponse]:
    """The leader's assignment to write, with the future; anyone else's SyncGroup: the future alone."""
    future: asyncio.Future[SyncGroupResponse] = shard.new_future()
    writes = _sync(shard, req, future)
    return Result(future, writes) if writes else future


def _sync(shard: GroupShard, req: SyncGroupRequest, future: asyncio.Future[SyncGroupResponse]) -> list[Write]:
    error = shard.group_status_error(req.group_id)
    if error is not None and error == Errors.COORDINATOR_LOAD_IN_PROGRESS:
        error = Errors.REBALANCE_IN_PROGRESS  # old clients rejoin on this instead of rediscovering
    group = shard.groups.get(req.group_id)
    if error is None:
        error = Errors.UNKNOWN_MEMBER_ID if group is None else _validate_sync_group(shard, group, req)
    # (the state read as an attribute here, not with is_in: a call per check, every member of a rebalance)
    if error is not None or group is None:
        future.set_result(SyncGroupResponse(error or Errors.UNKNOWN_SERVER_ERROR))
    elif (state := group.state) is EMPTY:
        future.set_result(SyncGroupResponse(Errors.UNKNOWN_MEMBER_ID))
    elif state is PREPARING:
        shard.observer.on_rebalance_in_progress(group.group_id, req.member_id, "SyncGroup")
        future.set_result(SyncGroupResponse(Errors.REBALANCE_IN_PROGRESS))
    elif state is COMPLETING:
        return _park_sync(shard, group, req, future)
    else:  # Stable
        shard.remove_pending_sync_member(group, req.member_id)
        member = group.get(req.member_id)
        future.set_result(SyncGroupResponse(_NONE, group.protocol_type, group.protocol_name,
                                            member.assignment))
        shard.schedule_heartbeat(group, member, member.session_timeout_ms)
    return []


def _validate_sync_group(shard: GroupShard, group: GroupMetadata, req: SyncGroupRequest) -> Errors | None:
    if group.state is DEAD:
        return Errors.COORDINATOR_NOT_AVAILABLE
    error = shard.validate_current_member(group, req.member_id, req.group_instance_id, "sync-group")
    if error is not None:
        return error
    if req.generation_id != group.generation_id:
        return Errors.ILLEGAL_GENERATION
    if req.protocol_type is not None and req.protocol_type != group.protocol_type:
        return Errors.INCONSISTENT_GROUP_PROTOCOL
    if req.protocol_name is not None and req.protocol_name != group.protocol_name:
        return Errors.INCONSISTENT_GROUP_PROTOCOL
    return None


def _park_sync(shard: GroupShard, group: GroupMetadata, req: SyncGroupRequest,
               future: asyncio.Future[SyncGroupResponse]) -> list[Write]:
    member = group.get(req.member_id)
    previous = member.sync_future
    member.sync_future = future
    if previous is not None and not previous.done():  # a retry from a new connection supersedes it
        previous.set_result(SyncGroupResponse(Errors.REBALANCE_IN_PROGRESS))
    if shard.observer.waits_watched:  # (a call per member: skipped when nobody watches)
        shard.observer.on_sync_waiting(group.group_id, req.member_id)
    shard.remove_pending_sync_member(group, req.member_id)
    if group.is_leader(req.member_id):
        return [_store_leader_assignment(shard, group, req)]
    return []


def _store_leader_assignment(shard: GroupShard, group: GroupMetadata, req: SyncGroupRequest) -> Write:
    generation_id = group.generation_id
    assignment = {a.member_id: a.assignment for a in req.assignments}
    missing = [m for m in group.members if m not in assignment]
    for member_id in missing:
        assignment[member_id] = b""
    if log.isEnabledFor(logging.INFO):  # two passes over the members for the line alone
        static = sum(1 for m in group.members.values() if m.is_static)
        # A member the leader gives nothing is normal (more members than partitions; Kafka logs nothing): counted
        # in the one line per rebalance, named only at DEBUG (thousands of members must not mean thousands of
        # lines).
        unassigned = [member_id for member_id, value in assignment.items() if not value]
        log.info("event=assignment_received group=%s leader=%s generation=%d members=%d static_members=%d "
                 "unassigned=%d", group.group_id, req.member_id, generation_id, group.size, static,
                 len(unassigned))
        if unassigned:
            log.debug("event=empty_assignments group=%s generation=%d omitted_by_leader=%d members=%s",
                      group.group_id, generation_id, len(missing), unassigned)
    record = group.to_record(assignment)
    shard.observer.on_assignment_write_started(group.group_id, generation_id)

    def written(append_error: Errors) -> None:
        error = group_append_error(append_error)
        shard.observer.on_assignment_write_completed(group.group_id, generation_id, error.name)
        _on_assignment_stored(shard, group, generation_id, req.member_id, assignment, error)

    return Write.group(group.group_id, record, written)


def _on_assignment_stored(shard: GroupShard, group: GroupMetadata, generation_id: int, leader_id: str,
                          assignment: dict[str, bytes], error: Errors) -> None:
    # Someone may have joined or left while the write was in flight: then this generation is over.
    if not group.is_in(COMPLETING) or generation_id != group.generation_id:
        return
    if error != Errors.NONE:
        log.warning("event=assignment_store_failed group=%s generation=%d error=%s",
                    group.group_id, generation_id, error.name)
        shard.reset_and_propagate_assignment_error(group, error)
        shard.maybe_prepare_rebalance(group, RebalanceCause(
            RebalanceCategory.ASSIGNMENT_STORE_FAILED,
            f"Error {error.name} when storing group assignment during SyncGroup (member: {leader_id})", leader_id))
        return
    for member in group.members.values():
        member.assignment = assignment.get(member.member_id, b"")
    shard.propagate_assignment(group, Errors.NONE)
    group.transition_to(STABLE, shard.now_wall_ms())
    shard.rebalance_completed(group)
