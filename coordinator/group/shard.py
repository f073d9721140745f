"""GroupShard: the groups of one state-topic partition, and the rebalance mechanics they share.

A shard owns its groups, its loading status and (through the group ids in them) its purgatory keys. Request
handlers (join.py, sync.py, offsets.py, admin.py) are plain functions of (shard, request) that mutate the shard
and return a `Result` (records to append, response or parked future); the runtime (runtime.py) appends the
records to the shard's partition and answers once Kafka acknowledged them. Nothing here awaits or calls the
store: a write group logic makes on its own (an emptied group's record, from a timer) goes to `shard.append`,
the runtime's same append, queued at once and in order.

What this module holds is what the handlers share: status checks, the rebalance mechanics (§4 of the
reference), loading and unloading of groups; session tracking is sessions.py's.
"""
from __future__ import annotations

import logging
from enum import Enum
from collections.abc import Iterable
from typing import Callable

from coordinator.config import CoordinatorConfig
from coordinator.group.api import UNKNOWN_MEMBER_ID, JoinGroupResponse, JoinGroupResponseMember, SyncGroupResponse
from coordinator.group.delayed import (DelayedHeartbeat, DelayedJoin, DelayedSync, InitialDelayedJoin, join_key,
                                       member_key, sync_key)
from coordinator.group.loading import materialize_group
from coordinator.group.member import MemberMetadata
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.metadata import GroupMetadata
from coordinator.group.observer import GroupObserver, RebalanceCategory, RebalanceCause
from coordinator.group.result import Write
from coordinator.group.sessions import SessionTracking
from coordinator.group.state import COMPLETING, DEAD, EMPTY, PREPARING, STABLE
from coordinator.group.records import Record
from coordinator.purgatory import DelayedOperation, DelayedOperationPurgatory
from coordinator.timer import Clock
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")


class ShardStatus(Enum):
    """Where a partition stands on this instance; requests for its groups are answered accordingly (§3.0)."""

    UNOWNED = "unowned"  # NOT_COORDINATOR: another instance (step 2) or nobody serves it
    LOADING = "loading"  # COORDINATOR_LOAD_IN_PROGRESS while its records are replayed
    ACTIVE = "active"
    STOPPED = "stopped"  # COORDINATOR_NOT_AVAILABLE: the service is shutting down


_STATUS_ERRORS = {
    ShardStatus.UNOWNED: Errors.NOT_COORDINATOR,
    ShardStatus.LOADING: Errors.COORDINATOR_LOAD_IN_PROGRESS,
    ShardStatus.STOPPED: Errors.COORDINATOR_NOT_AVAILABLE,
}


def _no_store(write: Write) -> None:
    raise RuntimeError(f"no store to append {len(write.records)} records of group {write.group_id} to")


class GroupShard(SessionTracking):
    def __init__(self, partition: int, config: CoordinatorConfig, clock: Clock, wall_clock: Clock,
                 observer: GroupObserver, heartbeat_purgatory: DelayedOperationPurgatory[DelayedHeartbeat],
                 rebalance_purgatory: DelayedOperationPurgatory[DelayedOperation],
                 append: Callable[[Write], object] | None = None) -> None:
        self.partition = partition
        self.config = config
        # Stored timestamps (commit and state-change times) are epoch ms, like Kafka's; deadlines and durations
        # use the monotonic clock. A test's manual clock serves as both, so one timeline drives everything.
        self.clock = clock
        self.wall_clock = wall_clock
        self.observer = observer
        self.heartbeat_purgatory = heartbeat_purgatory
        self.rebalance_purgatory = rebalance_purgatory
        self.status = ShardStatus.UNOWNED
        self.groups: dict[str, GroupMetadata] = {}
        self.consumer_groups: dict[str, ConsumerGroup] = {}  # KIP-848 groups (coordinator/group/modern)
        # The runtime's append to this shard's partition: the one write path, for a handler's Result and for a
        # write group logic makes on its own (a timer emptied a group) alike, queued in the order made.
        self.append: Callable[[Write], object] = append if append is not None else _no_store
        self.heartbeat_count = 0  # heartbeats are counted, never traced (metrics read the runtime's sum)
        self._offset_write_seq = 0

    def next_offset_write_seq(self) -> int:
        self._offset_write_seq += 1
        return self._offset_write_seq

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def now_wall_ms(self) -> int:
        return self.wall_clock.now_ms()

    # --- common checks (§3.0) ---------------------------------------------------------------------------------
    def group_status_error(self, group_id: str | None, empty_id_ok: bool = False) -> Errors | None:
        if group_id is None or (not group_id and not empty_id_ok):
            return Errors.INVALID_GROUP_ID
        return _STATUS_ERRORS.get(self.status)

    def validate_current_member(self, group: GroupMetadata, member_id: str, group_instance_id: str | None,
                                operation: str) -> Errors | None:
        if group_instance_id is not None:
            current = group.static_members.get(group_instance_id)
            if current is None:
                return Errors.UNKNOWN_MEMBER_ID
            if current != member_id:
                log.info("event=fenced group=%s member=%s group_instance_id=%s current_member=%s operation=%s",
                         group.group_id, member_id, group_instance_id, current, operation)
                return Errors.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return Errors.UNKNOWN_MEMBER_ID
        return None

    def add_group(self, group_id: str) -> GroupMetadata:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = GroupMetadata(group_id, EMPTY, self.now_wall_ms(), self.observer)
        return group

    # --- rebalance mechanics (§4) -----------------------------------------------------------------------------
    def maybe_prepare_rebalance(self, group: GroupMetadata, cause: RebalanceCause) -> None:
        if group.can_rebalance:
            self.prepare_rebalance(group, cause)

    def announce_rebalance(self, group: GroupMetadata, cause: RebalanceCause) -> None:
        """Tell observers a rebalance starts for `cause`, before the events of the cause (a member joined, left,
        failed) and before the group enters PreparingRebalance: a trace of it then holds them from the start."""
        self.observer.on_rebalance_starting(group.group_id, group.generation_id, cause)

    def rebalances_on_removal(self, group: GroupMetadata) -> bool:
        """Whether removing a member (remove_member_and_update_group) starts a rebalance."""
        return group.is_in(STABLE) or group.is_in(COMPLETING)

    def prepare_rebalance(self, group: GroupMetadata, cause: RebalanceCause) -> None:
        self.announce_rebalance(group, cause)
        if group.is_in(COMPLETING):
            self.reset_and_propagate_assignment_error(group, Errors.REBALANCE_IN_PROGRESS)
        self.remove_sync_expiration(group)
        delay_ms = self.config.group_initial_rebalance_delay_ms
        if group.is_in(EMPTY):
            remaining_ms = max(group.rebalance_timeout_ms - delay_ms, 0)
            op: DelayedJoin = InitialDelayedJoin(self, self.rebalance_purgatory, group, delay_ms, delay_ms,
                                                 remaining_ms)
        else:
            op = DelayedJoin(self, group, group.rebalance_timeout_ms)
        group.transition_to(PREPARING, self.now_wall_ms())
        if group.rebalance_started_ms is None:
            group.rebalance_started_ms = self.now_ms()
        log.info("event=rebalance_prepare group=%s generation=%d delay_ms=%d reason=%r",
                 group.group_id, group.generation_id, op.delay_ms, cause.text)
        self.observer.on_rebalance_started(group.group_id, group.generation_id, cause)
        self.rebalance_purgatory.try_complete_else_watch(op, [join_key(group.group_id)])

    def try_complete_join(self, group: GroupMetadata, force_complete: Callable[[], bool]) -> bool:
        # Dead: unloaded, nothing to wait for (Kafka lets the operation run out against the Dead group).
        return force_complete() if group.has_all_members_joined or group.is_in(DEAD) else False

    def on_complete_join(self, group: GroupMetadata) -> None:
        if group.is_in(DEAD):  # unloaded: Kafka drops the non-rejoined members unseen; nobody failed
            log.info("event=join_complete_skipped group=%s reason=dead", group.group_id)
            return
        self._remove_dynamic_members_not_rejoined(group)
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody re-joined: wait another rebalance timeout for session expiry to clear the members.
            log.error("event=no_member_rejoined group=%s generation=%d", group.group_id, group.generation_id)
            self.rebalance_purgatory.try_complete_else_watch(
                DelayedJoin(self, group, group.rebalance_timeout_ms), [join_key(group.group_id)])
        else:
            group.init_next_generation(self.now_wall_ms())
            self.observer.on_join_completed(group.group_id, group.generation_id, group.protocol_name,
                                            group.leader_id, group.size)
            if group.is_in(EMPTY):
                self._on_group_emptied(group)
            else:
                self._send_join_responses(group)

    def _remove_dynamic_members_not_rejoined(self, group: GroupMetadata) -> None:
        failed = [m for m in group.not_yet_rejoined_members() if not m.is_static]
        if not failed:
            return
        log.info("event=members_not_rejoined group=%s members=%s", group.group_id, [m.member_id for m in failed])
        for member in failed:
            # observers first, while the member is still there to describe (client id and host in its trace)
            self.observer.on_member_failed(group.group_id, member.member_id, None,
                                           "not rejoined before rebalance timeout")
            group.remove(member.member_id)
            self.remove_heartbeat(group, member)

    def _on_group_emptied(self, group: GroupMetadata) -> None:
        log.info("event=group_empty group=%s generation=%d", group.group_id, group.generation_id)
        self.rebalance_completed(group)

        def written(error: Errors) -> None:
            if error != Errors.NONE:  # only a warning in Kafka: the old generation times out if reloaded
                log.warning("event=store_empty_group_failed group=%s error=%s", group.group_id, error.name)

        self.append(Write.group(group.group_id, group.to_record({}), written))

    def _send_join_responses(self, group: GroupMetadata) -> None:
        log.info("event=group_stabilized group=%s generation=%d members=%d protocol=%s leader=%s",
                 group.group_id, group.generation_id, group.size, group.protocol_name, group.leader_id)
        all_members: list[JoinGroupResponseMember] | None = None
        for member in list(group.members.values()):
            is_leader = group.is_leader(member.member_id)
            if is_leader and all_members is None:
                all_members = self.member_list(group)
            members = all_members if is_leader and all_members is not None else []
            group.complete_join(member, self.join_response(group, member.member_id, members))
            self.schedule_heartbeat(group, member, member.session_timeout_ms)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        self.rebalance_purgatory.try_complete_else_watch(
            DelayedSync(self, group, group.generation_id, group.rebalance_timeout_ms), [sync_key(group.group_id)])

    def remove_member_and_update_group(self, group: GroupMetadata, member: MemberMetadata,
                                       cause: RebalanceCause) -> None:
        group.complete_join(member, JoinGroupResponse(Errors.UNKNOWN_MEMBER_ID, member_id=UNKNOWN_MEMBER_ID))
        # Kafka leaves a parked SyncGroup of a removed member unanswered; we answer it so no request hangs.
        group.complete_sync(member, SyncGroupResponse(Errors.REBALANCE_IN_PROGRESS))
        group.remove(member.member_id)
        if self.rebalances_on_removal(group):
            self.maybe_prepare_rebalance(group, cause)
        elif group.is_in(PREPARING):
            self.rebalance_purgatory.check_and_complete(join_key(group.group_id))

    def remove_pending_member_and_update_group(self, group: GroupMetadata, member_id: str) -> None:
        group.remove(member_id)
        if group.is_in(PREPARING):
            self.rebalance_purgatory.check_and_complete(join_key(group.group_id))

    # --- pending sync (DelayedSync, §4.6) ---------------------------------------------------------------------
    def remove_sync_expiration(self, group: GroupMetadata) -> None:
        group.pending_sync_members.clear()
        self.rebalance_purgatory.check_and_complete(sync_key(group.group_id))

    def remove_pending_sync_member(self, group: GroupMetadata, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        self.rebalance_purgatory.check_and_complete(sync_key(group.group_id))

    def try_complete_pending_sync(self, group: GroupMetadata, generation_id: int,
                                  force_complete: Callable[[], bool]) -> bool:
        if generation_id != group.generation_id or group.state in (DEAD, EMPTY, PREPARING):
            return force_complete()
        return force_complete() if not group.pending_sync_members else False

    def on_expire_pending_sync(self, group: GroupMetadata, generation_id: int) -> None:
        if generation_id != group.generation_id or group.state in (DEAD, EMPTY, PREPARING):
            log.error("event=unexpected_sync_expiration group=%s generation=%d current_generation=%d state=%s",
                      group.group_id, generation_id, group.generation_id, group.state.value)
            return
        if not group.pending_sync_members:
            return
        missing = sorted(group.pending_sync_members)
        cause = RebalanceCause(RebalanceCategory.SYNC_TIMEOUT, f"Removing {missing} on pending sync request expiration")
        self.announce_rebalance(group, cause)
        for member_id in missing:
            member = group.members.get(member_id)
            if member is not None:  # observers first, while the member is still there to describe
                self.observer.on_member_failed(group.group_id, member_id, member.group_instance_id,
                                               "no SyncGroup before rebalance timeout")
            group.remove(member_id)
            if member is not None:
                self.remove_heartbeat(group, member)
        log.info("event=members_not_synced group=%s members=%s", group.group_id, missing)
        self.prepare_rebalance(group, cause)

    # --- assignment propagation -------------------------------------------------------------------------------
    def reset_and_propagate_assignment_error(self, group: GroupMetadata, error: Errors) -> None:
        for member in group.members.values():
            member.assignment = b""
        self.propagate_assignment(group, error)

    def propagate_assignment(self, group: GroupMetadata, error: Errors) -> None:
        ok = error == Errors.NONE
        protocol_type, protocol_name = (group.protocol_type, group.protocol_name) if ok else (None, None)
        for member in list(group.members.values()):
            response = SyncGroupResponse(error, protocol_type, protocol_name, member.assignment)
            if group.complete_sync(member, response):
                self.schedule_heartbeat(group, member, member.session_timeout_ms)

    def rebalance_completed(self, group: GroupMetadata) -> None:
        started_ms = group.rebalance_started_ms
        group.rebalance_started_ms = None
        duration_ms = 0 if started_ms is None else self.now_ms() - started_ms
        log.info("event=rebalance_complete group=%s generation=%d members=%d duration_ms=%d",
                 group.group_id, group.generation_id, group.size, duration_ms)
        self.observer.on_rebalance_completed(group.group_id, group.generation_id, group.size, duration_ms)

    # --- responses --------------------------------------------------------------------------------------------
    @staticmethod
    def member_list(group: GroupMetadata) -> list[JoinGroupResponseMember]:
        return group.current_member_metadata()

    @staticmethod
    def join_response(group: GroupMetadata, member_id: str, members: list[JoinGroupResponseMember], leader: str | None = None,
                      skip_assignment: bool = False) -> JoinGroupResponse:
        return JoinGroupResponse(
            Errors.NONE, member_id=member_id, generation_id=group.generation_id,
            protocol_type=group.protocol_type, protocol_name=group.protocol_name,
            leader=(group.leader_id if leader is None else leader) or "", skip_assignment=skip_assignment,
            members=members)

    # --- loading and unloading (§7.4, §7.5) -------------------------------------------------------------------
    def load_group(self, group_id: str, records: Iterable[Record]) -> None:
        """Replay one loaded group's records (its latest metadata and offsets): Stable with members, else Empty."""
        if group_id in self.groups:
            log.warning("event=load_skipped group=%s reason=already_cached", group_id)
            return
        try:
            group = materialize_group(group_id, records, self.now_wall_ms(), self.observer)
        except Exception:  # a record we cannot make sense of costs that group, not the others
            log.exception("event=load_failed group=%s", group_id)
            return
        self.groups[group_id] = group
        self._on_group_loaded(group)

    def _on_group_loaded(self, group: GroupMetadata) -> None:
        log.info("event=group_loaded group=%s generation=%d state=%s members=%d",
                 group.group_id, group.generation_id, group.state.value, group.size)
        if group.size > self.config.group_max_size:
            self.prepare_rebalance(group, RebalanceCause(
                RebalanceCategory.OVER_CAPACITY,
                f"Freshly-loaded group is over capacity ({self.config.group_max_size}). "
                "Rebalancing in order to give a chance for consumers to commit offsets"))
        for member in list(group.members.values()):
            self.schedule_heartbeat(group, member, member.session_timeout_ms)

    def unload_group(self, group: GroupMetadata, error: Errors = Errors.NOT_COORDINATOR) -> None:
        """The one funnel that answers every parked request of a group that leaves this coordinator."""
        previous = group.state
        group.transition_to(DEAD, self.now_wall_ms())
        for member in list(group.members.values()):
            group.complete_join(member, JoinGroupResponse(error, member_id=member.member_id))
            group.complete_sync(member, SyncGroupResponse(error))
            self.remove_heartbeat(group, member)
        for member_id in group.pending_members:  # their expirations complete against the Dead group
            self.heartbeat_purgatory.check_and_complete(member_key(group.group_id, member_id))
        if previous is PREPARING:
            self.rebalance_purgatory.check_and_complete(join_key(group.group_id))
        self.remove_sync_expiration(group)
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

    def unload_all(self, error: Errors = Errors.NOT_COORDINATOR) -> None:
        for group in list(self.groups.values()):
            self.unload_group(group, error)
