"""The rebalance mechanics (§4 of the reference) the request handlers and timers share: preparing a rebalance
(DelayedJoin, InitialDelayedJoin), completing its join phase (members not rejoined removed, the next generation,
the JoinGroup responses, or the emptied group's record), removing a member, and the responses built on the way.
Mixed into GroupShard."""
from __future__ import annotations

import logging
from typing import Callable

from coordinator.config import CoordinatorConfig
from coordinator.group.api import UNKNOWN_MEMBER_ID, JoinGroupResponse, JoinGroupResponseMember, SyncGroupResponse
from coordinator.group.delayed import DelayedJoin, DelayedSync, InitialDelayedJoin, join_key, sync_key
from coordinator.group.member import MemberMetadata
from coordinator.group.metadata import GroupMetadata
from coordinator.group.observer import RebalanceCause
from coordinator.group.result import Write
from coordinator.group.state import COMPLETING, DEAD, EMPTY, PREPARING, STABLE
from coordinator.group.sync_phase import SyncPhase
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")
_NONE = Errors.NONE  # a global: an Enum class attribute costs ten times as much, once per member and answer


class Rebalancing(SyncPhase):
    config: CoordinatorConfig
    append: Callable[[Write], object]
    # the runtime's: the store is told this shard's partition will be written soon (GroupStore.expect_append)
    expect_write: Callable[[], object] | None = None

    def now_ms(self) -> int:
        raise NotImplementedError  # the shard's clocks

    def now_wall_ms(self) -> int:
        raise NotImplementedError

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
        if self.given_up:  # being unloaded: its parked JoinGroups are answered by the unload
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
        if self.expect_write is not None:  # the leader's assignment: its write's transaction opens meanwhile
            self.expect_write()
        # The leader first: its answer starts the rest of the rebalance (its assignor, its SyncGroup and the
        # assignment's write), which then overlaps the answers to the other members.
        leader = group.members.get(group.leader_id or "")
        members = list(group.members.values())
        if leader is not None and members[0] is not leader:
            members.remove(leader)
            members.insert(0, leader)
        # One pass, the generation's fields read once and the clock once (the same millisecond for every member);
        # each answer built positionally in JoinGroupResponse's field order, as join_response builds it.
        generation_id, protocol_type, protocol_name = group.generation_id, group.protocol_type, group.protocol_name
        leader_id = group.leader_id or ""
        now_ms = self.now_ms()
        pending_sync = group.pending_sync_members
        for member in members:
            member_id = member.member_id
            group.complete_join(member, JoinGroupResponse(
                _NONE, member_id, generation_id, protocol_type, protocol_name, leader_id, False,
                self.member_list(group) if member is leader else []))
            self.schedule_heartbeat(group, member, member.session_timeout_ms, now_ms)
            member.is_new = False
            pending_sync.add(member_id)
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
        # positional (a third of the keywords' cost: one per member and rebalance), in JoinGroupResponse's field
        # order (tests/unit/test_group_fastpath.py checks it against the keywords)
        return JoinGroupResponse(
            _NONE, member_id, group.generation_id, group.protocol_type, group.protocol_name,
            (group.leader_id if leader is None else leader) or "", skip_assignment, members)
