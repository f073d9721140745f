"""JoinGroup (§3.1) and static membership (§4.7): `handle_join_group(shard, request)` answers at once or parks
the request in its member (a future the rebalance answers); a static member replaced in a Stable group is
answered once its new member id is written."""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Callable

from coordinator.group.api import UNKNOWN_MEMBER_ID, JoinGroupRequest, JoinGroupResponse, SyncGroupResponse
from coordinator.group.delayed import join_key, member_key
from protocol.error_codes import Errors
from coordinator.group.errors import group_append_error
from coordinator.group.member import MemberMetadata
from coordinator.group.member_snapshot import MemberSnapshot
from coordinator.group.observer import RebalanceCategory, RebalanceCause
from coordinator.group.replacement_hold import ReplacementHold, close_hold, held_by, holding_group, open_hold
from coordinator.group.result import Write
from coordinator.group.state import COMPLETING, DEAD, EMPTY, PREPARING, STABLE

if TYPE_CHECKING:
    from coordinator.group.shard import GroupShard
    from coordinator.group.metadata import GroupMetadata

log = logging.getLogger("coordinator.group")

def random_member_id_suffix() -> str:
    return str(uuid.uuid4())


# The unique part of every member id; the deterministic simulator swaps in a seeded source (simulator/ids.py).
member_id_suffix: Callable[[], str] = random_member_id_suffix


def generate_member_id(client_id: str, group_instance_id: str | None) -> str:
    return f"{group_instance_id if group_instance_id is not None else client_id}-{member_id_suffix()}"


def _answer(future: asyncio.Future[JoinGroupResponse], response: JoinGroupResponse) -> None:
    if not future.done():
        future.set_result(response)


def handle_join_group(shard: GroupShard, req: JoinGroupRequest) -> asyncio.Future[JoinGroupResponse]:
    """The response future is answered now, or parked in the member until the join phase completes (no write
    of the request's own: a static replacement's is made by group logic, `shard.append`)."""
    future: asyncio.Future[JoinGroupResponse] = shard.new_future()
    _join(shard, req, future)
    return future


def _consumer_group_join_error(shard: GroupShard, group_id: str) -> Errors | None:
    """A classic JoinGroup for a KIP-848 group that reached this handler: the runtime serves a non-empty one
    itself (coordinator/group/modern/classic.py), so a non-empty one here is refused; an empty one gives way to
    the classic group, as Kafka converts it."""
    replaced = shard.consumer_groups[group_id]
    if replaced.members:
        return Errors.INCONSISTENT_GROUP_PROTOCOL
    del shard.consumer_groups[group_id]
    shard.consumer_group_replaced(shard, replaced)
    existing = shard.groups.get(group_id)
    if existing is None or (existing.protocol_type is None and not existing.members):
        # a new classic group from generation 0 (the offsets' holder is one); not one loaded beside it
        shard.observer.on_group_replaced(group_id, "classic")
    return None


def _join(shard: GroupShard, req: JoinGroupRequest, future: asyncio.Future[JoinGroupResponse]) -> None:
    error = shard.group_status_error(req.group_id)
    if error is None and not (shard.config.group_min_session_timeout_ms <= req.session_timeout_ms
                              <= shard.config.group_max_session_timeout_ms):
        error = Errors.INVALID_SESSION_TIMEOUT
    is_unknown = req.member_id == UNKNOWN_MEMBER_ID
    if error is None and req.group_id in shard.consumer_groups:
        error = _consumer_group_join_error(shard, req.group_id)
    group = shard.groups.get(req.group_id)
    if error is None and group is None:
        if is_unknown:
            group = shard.add_group(req.group_id)
        else:
            error = Errors.UNKNOWN_MEMBER_ID
    if error is not None or group is None:
        _answer(future, JoinGroupResponse(error or Errors.UNKNOWN_SERVER_ERROR, member_id=req.member_id))
        return
    if not _accept_joining_member(shard, group, req.member_id):
        _reject_over_capacity(shard, group, req.member_id)
        _answer(future, JoinGroupResponse(Errors.GROUP_MAX_SIZE_REACHED, member_id=UNKNOWN_MEMBER_ID))
    elif is_unknown:
        _do_new_member_join(shard, group, req, future)
    else:
        _do_current_member_join(shard, group, req, future)
    # (the state read as an attribute on this path, not with is_in: a call per check, every member of a rebalance)
    if group.state is PREPARING and group.has_all_members_joined:  # short of that, no DelayedJoin completes
        shard.rebalance_purgatory.check_and_complete(join_key(group.group_id))


def _accept_joining_member(shard: GroupShard, group: GroupMetadata, member_id: str) -> bool:
    max_size = shard.config.group_max_size
    state = group.state
    if state is EMPTY or state is DEAD:
        return True
    if state is PREPARING:
        member = group.members.get(member_id)
        return (member is not None and member.is_awaiting_join) or group.num_members_awaiting_join < max_size
    return member_id in group.members or group.size < max_size


def _reject_over_capacity(shard: GroupShard, group: GroupMetadata, member_id: str) -> None:
    member = group.members.get(member_id)
    if member is not None:  # observers first, while the member is still there to describe
        shard.observer.on_member_failed(group.group_id, member_id, member.group_instance_id,
                                       "group max size reached")
    group.remove(member_id)  # Kafka removes an existing member that is over capacity, silently
    log.info("event=join_rejected group=%s member=%s reason=group_max_size max_size=%d",
             group.group_id, member_id, shard.config.group_max_size)

# --- unknown member id ------------------------------------------------------------------------------------
def _do_new_member_join(shard: GroupShard, group: GroupMetadata, req: JoinGroupRequest,
                        future: asyncio.Future[JoinGroupResponse]) -> None:
    if group.is_in(DEAD):
        _answer(future, JoinGroupResponse(Errors.COORDINATOR_NOT_AVAILABLE, member_id=req.member_id))
        return
    if not group.supports_protocols(req.protocol_type, req.protocols):
        _answer(future, JoinGroupResponse(Errors.INCONSISTENT_GROUP_PROTOCOL, member_id=req.member_id))
        return
    new_member_id = generate_member_id(req.client_id, req.group_instance_id)
    if req.group_instance_id is not None:
        old_member_id = group.static_members.get(req.group_instance_id)
        if old_member_id is not None:
            log.info("event=static_member_replace group=%s group_instance_id=%s old_member=%s new_member=%s "
                     "state=%s", group.group_id, req.group_instance_id, old_member_id, new_member_id,
                     group.state.value)
            _update_static_member_and_rebalance(shard, group, old_member_id, new_member_id, req, future)
        else:
            _add_member_and_rebalance(shard, group, new_member_id, req, future)
    elif req.require_known_member_id:
        log.info("event=member_id_required group=%s member=%s state=%s",
                 group.group_id, new_member_id, group.state.value)
        group.pending_members.add(new_member_id)
        shard.add_pending_member_expiration(group, new_member_id, req.session_timeout_ms)
        _answer(future, JoinGroupResponse(Errors.MEMBER_ID_REQUIRED, member_id=new_member_id))
    else:
        _add_member_and_rebalance(shard, group, new_member_id, req, future)

# --- known member id --------------------------------------------------------------------------------------
def _do_current_member_join(shard: GroupShard, group: GroupMetadata, req: JoinGroupRequest,
                            future: asyncio.Future[JoinGroupResponse]) -> None:
    member_id = req.member_id
    if group.state is DEAD:
        _answer(future, JoinGroupResponse(Errors.COORDINATOR_NOT_AVAILABLE, member_id=member_id))
    elif not group.supports_protocols(req.protocol_type, req.protocols):
        _answer(future, JoinGroupResponse(Errors.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id))
    elif member_id in group.pending_members:
        if req.group_instance_id is not None:  # Kafka throws IllegalStateException: UNKNOWN_SERVER_ERROR
            log.error("event=pending_member_with_instance_id group=%s member=%s group_instance_id=%s",
                      group.group_id, member_id, req.group_instance_id)
            _answer(future, JoinGroupResponse(Errors.UNKNOWN_SERVER_ERROR, member_id=member_id))
        else:
            _add_member_and_rebalance(shard, group, member_id, req, future)
    else:
        error = shard.validate_current_member(group, member_id, req.group_instance_id, "join-group")
        if error is not None:
            _answer(future, JoinGroupResponse(error, member_id=member_id))
        else:
            _do_existing_member_join(shard, group, group.get(member_id), req, future)


def _do_existing_member_join(shard: GroupShard, group: GroupMetadata, member: MemberMetadata,
                             req: JoinGroupRequest, future: asyncio.Future[JoinGroupResponse]) -> None:
    protocols = req.protocols
    reason = req.reason or "not provided"
    if group.state is PREPARING:  # every member of a rebalance: no rebalance to start, so no cause to describe
        _update_member(group, member, req, future)
    elif group.is_in(COMPLETING):
        if member.matches(protocols):
            # Probably a lost JoinGroup response: answer again for the current generation.
            members = shard.member_list(group) if group.is_leader(member.member_id) else []
            _answer(future, shard.join_response(group, member.member_id, members))
        else:
            _update_member_and_rebalance(shard, 
                group, member, req, future, RebalanceCategory.METADATA_CHANGED,
                f"Updating metadata for member {member.member_id} during {group.state.value}; "
                f"client reason: {reason}")
    elif group.is_in(STABLE):
        if group.is_leader(member.member_id):
            _update_member_and_rebalance(shard, 
                group, member, req, future, RebalanceCategory.LEADER_REJOINED,
                f"Leader {member.member_id} re-joining group during {group.state.value}; client reason: {reason}")
        elif not member.matches(protocols):
            _update_member_and_rebalance(shard, 
                group, member, req, future, RebalanceCategory.METADATA_CHANGED,
                f"Updating metadata for member {member.member_id} during {group.state.value}; "
                f"client reason: {reason}")
        else:
            _answer(future, shard.join_response(group, member.member_id, []))
    else:  # Empty (Dead was answered before)
        log.warning("event=rejoin_unexpected_state group=%s member=%s state=%s",
                    group.group_id, member.member_id, group.state.value)
        _answer(future, JoinGroupResponse(Errors.UNKNOWN_MEMBER_ID, member_id=member.member_id))

# --- membership changes -----------------------------------------------------------------------------------
def _add_member_and_rebalance(shard: GroupShard, group: GroupMetadata, member_id: str,
                              req: JoinGroupRequest, future: asyncio.Future[JoinGroupResponse]) -> None:
    member = MemberMetadata(member_id, req.group_instance_id, req.client_id, req.client_host,
                            req.rebalance_timeout_ms, req.session_timeout_ms, req.protocol_type,
                            req.protocols)
    member.is_new = True
    cause = RebalanceCause(
        RebalanceCategory.MEMBER_JOINED, f"Adding new member {member_id} with group instance id "
                                         f"{req.group_instance_id}; client reason: {req.reason or 'not provided'}",
        member_id, req.reason)
    if group.can_rebalance:
        shard.announce_rebalance(group, cause)
    if group.is_in(PREPARING) and group.generation_id == 0:
        group.new_member_added = True
    was_pending = member_id in group.pending_members
    group.add(member, future)
    if was_pending:  # Kafka's reschedule checks the member key, completing the pending-member expiration
        shard.heartbeat_purgatory.check_and_complete(member_key(group.group_id, member_id))
    log.info("event=member_added group=%s member=%s group_instance_id=%s client_id=%s client_host=%s "
             "session_timeout_ms=%d rebalance_timeout_ms=%d", group.group_id, member_id,
             req.group_instance_id, req.client_id, req.client_host, req.session_timeout_ms,
             req.rebalance_timeout_ms)
    shard.observer.on_member_joined(group.group_id, member_id, req.group_instance_id, req.client_id,
                                   req.client_host)
    # New members cannot heartbeat while parked (no id yet): guard them with the new-member join timeout.
    shard.schedule_heartbeat(group, member, shard.config.new_member_join_timeout_ms)
    shard.maybe_prepare_rebalance(group, cause)


def _update_member_and_rebalance(shard: GroupShard, group: GroupMetadata, member: MemberMetadata,
                                 req: JoinGroupRequest, future: asyncio.Future[JoinGroupResponse],
                                 category: RebalanceCategory, text: str) -> None:
    _update_member(group, member, req, future)
    shard.maybe_prepare_rebalance(group, RebalanceCause(category, text, member.member_id, req.reason))


def _update_member(group: GroupMetadata, member: MemberMetadata, req: JoinGroupRequest,
                   future: asyncio.Future[JoinGroupResponse]) -> None:
    superseded = group.update_member(member, req.protocols,
                                     req.rebalance_timeout_ms, req.session_timeout_ms, future)
    if superseded is not None and not superseded.done():
        # Kafka drops the older parked request silently; answer it so it does not hang.
        superseded.set_result(JoinGroupResponse(Errors.REBALANCE_IN_PROGRESS, member_id=member.member_id))


def _update_static_member_and_rebalance(shard: GroupShard, group: GroupMetadata, old_member_id: str,
                                        new_member_id: str, req: JoinGroupRequest,
                                        future: asyncio.Future[JoinGroupResponse]) -> None:
    instance_id = req.group_instance_id
    assert instance_id is not None
    current_leader = group.leader_id
    old = group.get(old_member_id)
    before = MemberSnapshot.of(old)  # what a failed write of the replacement returns the member to
    group.complete_join(old, JoinGroupResponse(Errors.FENCED_INSTANCE_ID, member_id=old_member_id))
    group.complete_sync(old, _fenced_sync())
    member = group.replace_static_member(instance_id, old_member_id, new_member_id)
    reason = req.reason or "not provided"
    if group.is_in(COMPLETING):  # the replacement's rebalance (below): its trace holds the replacement
        shard.announce_rebalance(group, _static_update_cause(new_member_id, instance_id, reason, req))
    shard.observer.on_member_replaced(group.group_id, old_member_id, new_member_id, instance_id)
    shard.schedule_heartbeat(group, member, member.session_timeout_ms)
    group.update_member(member, req.protocols, req.rebalance_timeout_ms,
                        req.session_timeout_ms, future)
    if group.is_in(STABLE):
        if group.protocol_name == group.select_protocol():
            _persist_static_replacement(shard, group, member, before, current_leader, req, future)
        else:
            shard.maybe_prepare_rebalance(group, RebalanceCause(
                RebalanceCategory.STATIC_MEMBER,
                f"Group's selectedProtocol will change because static member {new_member_id} with "
                f"instance id {instance_id} joined with change of protocol; client reason: {reason}",
                new_member_id, req.reason))
    elif group.is_in(COMPLETING):
        # The leader may already have assigned partitions to the old member id.
        shard.prepare_rebalance(group, _static_update_cause(new_member_id, instance_id, reason, req))
    elif group.state in (EMPTY, DEAD):
        raise RuntimeError(f"Group {group.group_id} was not supposed to be in the state {group.state.value} "
                           f"when the unknown static member {instance_id} rejoins.")


def _static_update_cause(new_member_id: str, instance_id: str, reason: str, req: JoinGroupRequest
                         ) -> RebalanceCause:
    return RebalanceCause(RebalanceCategory.STATIC_MEMBER, f"Updating metadata for static member {new_member_id} "
                                                           f"with instance id {instance_id}; client reason: {reason}",
                          new_member_id, req.reason)


def _persist_static_replacement(shard: GroupShard, group: GroupMetadata, member: MemberMetadata,
                                before: MemberSnapshot, current_leader: str | None, req: JoinGroupRequest,
                                future: asyncio.Future[JoinGroupResponse]) -> None:
    """Stable and the selected protocol is unchanged: store the new member id, no rebalance; if that write
    fails, the member goes back to `before` — unless a rebalance completed meanwhile: the member took part in
    the new generation under its new id (its JoinGroup answered with it), and that generation's own record
    carries the id, so there is nothing to undo (going back would fence the live member with a gone one's id,
    in a generation whose acknowledged record names the new one); nor while a later write of the group that
    carries the new id (another static member's replacement) is unanswered: the revert waits for those, and one
    of them acknowledged stores the id (coordinator/group/replacement_hold.py). A conversion to a consumer group
    is such a write too: while it is unanswered the replaced group is Dead, and if it fails, the classic group it
    puts back is the one the replacement is decided against (`holding_group`), as Kafka's append future reverts
    the classic group object its failed conversion leaves in place."""
    record = group.to_record({m.member_id: m.assignment for m in group.members.values()})
    replacement = _StaticReplacement(shard, group, member, before, current_leader, req, future)
    write = Write.group(group.group_id, record, replacement.on_append)
    held_by(group, record, write)  # this write carries the ids of earlier replacements still undecided
    hold = replacement.hold = open_hold(group, member.member_id)  # opened after: its own write does not hold it
    hold.on_settled = replacement.on_settled  # the decision refers to the hold: close_hold drops this
    log.info("event=static_member_replaced_without_rebalance group=%s member=%s", group.group_id,
             member.member_id)
    shard.append(write)


class _StaticReplacement:
    """`_persist_static_replacement`'s decision once its write is answered, as an object, not a nested function:
    compiled by mypyc, a nested function and its enclosing function's locals share one environment object that
    the nested function holds, a reference cycle per replacement left to the cyclic collector (never freed once
    the server has frozen it, coordinator/runtime_health.py). Its bound methods are the write's callback and the
    hold's `on_settled`; the hold's reference is dropped by `close_hold`."""

    __slots__ = ("shard", "group", "before", "current_leader", "req", "future", "hold", "new_member_id",
                 "instance_id", "generation")
    hold: ReplacementHold  # set once the write is made (`_persist_static_replacement`)

    def __init__(self, shard: GroupShard, group: GroupMetadata, member: MemberMetadata, before: MemberSnapshot,
                 current_leader: str | None, req: JoinGroupRequest, future: asyncio.Future[JoinGroupResponse]
                 ) -> None:
        self.shard = shard
        self.group = group
        self.before = before
        self.current_leader = current_leader
        self.req = req
        self.future = future
        self.new_member_id = member.member_id
        self.instance_id = member.group_instance_id or ""
        self.generation = group.generation_id

    def on_append(self, append_error: Errors) -> None:
        self.decide(group_append_error(append_error))

    def on_settled(self) -> None:
        self.decide(self.hold.failed_with or Errors.UNKNOWN_SERVER_ERROR)

    def decide(self, error: Errors) -> None:
        group, hold, future, new_member_id = self.group, self.hold, self.future, self.new_member_id
        current = holding_group(self.shard.groups, group, hold)
        if current.is_in(DEAD) and error != Errors.NONE and hold.undecided:
            # converted meanwhile, the conversion's write (carrying the id) unanswered: if it fails, a classic
            # group comes back with the id, to be reverted then
            log.warning("event=static_member_persist_failed group=%s member=%s error=%s reverted=held "
                        "later_writes=%d", group.group_id, new_member_id, error.name, hold.pending)
            hold.failed_with = error
            return
        if current.is_in(DEAD):  # unloaded (or converted) meanwhile: its parked requests were answered then
            _answer(future, JoinGroupResponse(Errors.NOT_COORDINATOR, member_id=new_member_id))
        elif current.static_members.get(self.instance_id) != new_member_id:
            # Replaced again (or removed) meanwhile: the member is no longer this request's to answer for
            # or to restore; this request was fenced then.
            _answer(future, JoinGroupResponse(Errors.FENCED_INSTANCE_ID, member_id=new_member_id))
        elif error != Errors.NONE and current.generation_id != self.generation:
            log.warning("event=static_member_persist_failed group=%s member=%s error=%s reverted=false "
                        "reason=generation_completed generation=%d", group.group_id, new_member_id, error.name,
                        current.generation_id)
            _answer(future, JoinGroupResponse(Errors.REBALANCE_IN_PROGRESS, member_id=new_member_id))
        elif error != Errors.NONE and hold.undecided:
            log.warning("event=static_member_persist_failed group=%s member=%s error=%s reverted=held "
                        "later_writes=%d", group.group_id, new_member_id, error.name, hold.pending)
            hold.failed_with = error  # decided again once those writes are answered (hold.on_settled)
            return
        elif error != Errors.NONE and not hold.written:
            _restore_static_member(self.shard, current, current.get(new_member_id), self.before,
                                   self.current_leader, error, future)
        else:
            if error != Errors.NONE:
                log.warning("event=static_member_persist_failed group=%s member=%s error=%s reverted=false "
                            "reason=stored_by_later_write", group.group_id, new_member_id, error.name)
            _answer_stored_replacement(self.shard, current, current.get(new_member_id), self.current_leader,
                                       self.req, future)
        close_hold(current, hold)


def _answer_stored_replacement(shard: GroupShard, group: GroupMetadata, member: MemberMetadata,
                               current_leader: str | None, req: JoinGroupRequest,
                               future: asyncio.Future[JoinGroupResponse]) -> None:
    new_member_id = member.member_id
    if req.supports_skip_assignment:
        is_leader = group.is_leader(new_member_id)
        members = shard.member_list(group) if is_leader else []
        _complete_own_join(group, member, future, shard.join_response(
            group, new_member_id, members, skip_assignment=is_leader))
    else:
        # Before v9 the rejoined member is told the old leader id, so a replaced leader does not run
        # the assignor for a Stable group that would ignore the result.
        _complete_own_join(group, member, future,
                           shard.join_response(group, new_member_id, [], leader=current_leader))


def _restore_static_member(shard: GroupShard, group: GroupMetadata, member: MemberMetadata,
                           before: MemberSnapshot, current_leader: str | None, error: Errors,
                           future: asyncio.Future[JoinGroupResponse]) -> None:
    log.warning("event=static_member_persist_failed group=%s member=%s error=%s", group.group_id,
                member.member_id, error.name)
    replacement_id = member.member_id
    parked = before.restore(group, member)
    if parked is not None and parked is not future:  # never dropped silently (Kafka drops it)
        _answer(parked, JoinGroupResponse(error, member_id=UNKNOWN_MEMBER_ID))
    assert member.group_instance_id is not None  # the caller checked the instance still maps to this member
    shard.observer.on_member_replaced(group.group_id, replacement_id, member.member_id, member.group_instance_id)
    shard.schedule_heartbeat(group, member, member.session_timeout_ms)
    _answer(future, JoinGroupResponse(
        error, member_id=UNKNOWN_MEMBER_ID, generation_id=group.generation_id,
        protocol_type=group.protocol_type, protocol_name=group.protocol_name, leader=current_leader or ""))


def _complete_own_join(group: GroupMetadata, member: MemberMetadata, future: asyncio.Future[JoinGroupResponse],
                       response: JoinGroupResponse) -> None:
    """Answers `future`; clears it from the member only if it is still the member's parked join."""
    if member.join_future is future:
        group.complete_join(member, response)
    else:
        _answer(future, response)


def _fenced_sync() -> SyncGroupResponse:
    return SyncGroupResponse(Errors.FENCED_INSTANCE_ID)
