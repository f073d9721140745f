"""Session tracking (DelayedHeartbeat, §4.8 of the reference): a member's session deadline, moved by every
heartbeat and checked when its DelayedHeartbeat fires; a member whose session ran out is removed (a rebalance
follows). Mixed into GroupShard, whose rebalance mechanics the expiry calls."""
from __future__ import annotations

import logging

from coordinator.group.delayed import DelayedHeartbeat, member_key
from coordinator.group.member import MemberMetadata
from coordinator.group.metadata import GroupMetadata
from coordinator.group.observer import GroupObserver, RebalanceCategory, RebalanceCause
from coordinator.group.state import DEAD
from coordinator.group.status import ShardStatus
from coordinator.purgatory import DelayedOperationPurgatory
from coordinator.timer import Clock

log = logging.getLogger("coordinator.group")

_UNOWNED, _STOPPED = ShardStatus.UNOWNED, ShardStatus.STOPPED


class SessionTracking:
    clock: Clock
    observer: GroupObserver
    heartbeat_purgatory: DelayedOperationPurgatory[DelayedHeartbeat]
    status: ShardStatus

    @property
    def given_up(self) -> bool:
        """Leaving this instance (revoked, lost, fenced, or the service stopping): its groups are being unloaded, a
        slice per loop turn (residency.py), not served; the timers of a group the unload has not reached yet do
        nothing (the unload answers for it)."""
        status = self.status
        return status is _UNOWNED or status is _STOPPED

    def remove_member_and_update_group(self, group: GroupMetadata, member: MemberMetadata,
                                       cause: RebalanceCause) -> None:
        raise NotImplementedError  # the shard's rebalance mechanics

    def remove_pending_member_and_update_group(self, group: GroupMetadata, member_id: str) -> None:
        raise NotImplementedError

    def rebalances_on_removal(self, group: GroupMetadata) -> bool:
        raise NotImplementedError

    def announce_rebalance(self, group: GroupMetadata, cause: RebalanceCause) -> None:
        raise NotImplementedError

    @staticmethod
    def has_satisfied_heartbeat(member: MemberMetadata) -> bool:
        """A member parked in JoinGroup/SyncGroup is alive, unless it is new (§4.8)."""
        return not member.is_new and (member.join_future is not None or member.sync_future is not None)

    def schedule_heartbeat(self, group: GroupMetadata, member: MemberMetadata, timeout_ms: int,
                           now_ms: int | None = None) -> None:
        """Kafka's completeAndScheduleNextExpiration. The hot path: a heartbeat only moves the deadline; the
        DelayedHeartbeat already in the timer re-checks the deadline when it fires and re-arms for the rest,
        so the timer sees one operation per session timeout instead of one per heartbeat. `now_ms`: the clock
        read once for a whole group answered in one pass."""
        deadline_ms = (self.clock.now_ms() if now_ms is None else now_ms) + timeout_ms
        member.heartbeat_deadline_ms = deadline_ms
        op = member.heartbeat_op
        if op is not None and not op.is_completed:
            if op.deadline_ms <= deadline_ms and op.member_id == member.member_id:
                return
            op.force_complete()
        member.heartbeat_op = None
        if self.has_satisfied_heartbeat(member):
            return  # Kafka: the operation completes at once; no timer until the response is sent
        self._arm_heartbeat(group, member, timeout_ms)

    def _arm_heartbeat(self, group: GroupMetadata, member: MemberMetadata, timeout_ms: int) -> None:
        op = DelayedHeartbeat(self, group, member.member_id, False, timeout_ms, self.clock.now_ms())
        member.heartbeat_op = op
        self.heartbeat_purgatory.try_complete_else_watch(op, [member_key(group.group_id, member.member_id)])

    def add_pending_member_expiration(self, group: GroupMetadata, member_id: str, timeout_ms: int) -> None:
        op = DelayedHeartbeat(self, group, member_id, True, timeout_ms, self.clock.now_ms())
        self.heartbeat_purgatory.try_complete_else_watch(op, [member_key(group.group_id, member_id)])

    def remove_heartbeat(self, group: GroupMetadata, member: MemberMetadata) -> None:
        member.heartbeat_op = None
        self.heartbeat_purgatory.check_and_complete(member_key(group.group_id, member.member_id))

    @staticmethod
    def _member_timed_by(op: DelayedHeartbeat) -> MemberMetadata | None:
        """The member whose current session operation is `op`; None when it left the group or a newer operation
        times it (what every decision about a member's operation starts from)."""
        member = op.group.members.get(op.member_id)
        return member if member is not None and member.heartbeat_op is op else None

    def try_complete_heartbeat(self, op: DelayedHeartbeat) -> bool:
        group = op.group
        if group.is_in(DEAD):
            return op.force_complete()
        if op.is_pending:
            gone = op.member_id in group.members or op.member_id not in group.pending_members
            return op.force_complete() if gone else False
        member = self._member_timed_by(op)
        if member is None or self.has_satisfied_heartbeat(member):
            return op.force_complete()
        return False

    def on_expire_heartbeat(self, op: DelayedHeartbeat) -> None:
        if self.given_up:
            return
        group = op.group
        if group.is_in(DEAD):
            log.info("event=heartbeat_expired_after_unload group=%s member=%s", group.group_id, op.member_id)
        elif op.is_pending:
            if op.member_id in group.pending_members:
                log.info("event=pending_member_expired group=%s member=%s", group.group_id, op.member_id)
                self.remove_pending_member_and_update_group(group, op.member_id)
        else:
            member = self._member_timed_by(op)
            if member is not None:
                member.heartbeat_op = None
                self._check_session(group, member, op)

    def postponed_heartbeat_ms(self, op: DelayedHeartbeat, expiration_ms: int) -> int:
        """Asked by the timer as it moves `op` toward its expiration: the member's session deadline when heartbeats
        moved it past that expiration, so the operation waits for the deadline in the coarse wheels. The same
        expiry as letting it run: `_check_session` would find the deadline ahead and re-arm the same operation for
        it (a session timeout of 30 s with a heartbeat every 10 s: once per heartbeat or two, each re-arm
        cascading through every wheel again); only the member it would re-arm is postponed (its current operation,
        not waiting in a rebalance, its group alive); anything else runs at the expiration it has."""
        if op.is_pending:
            return expiration_ms
        member = self._member_timed_by(op)
        if member is None or op.group.state is DEAD or self.has_satisfied_heartbeat(member):
            return expiration_ms
        deadline_ms = member.heartbeat_deadline_ms
        if deadline_ms <= expiration_ms:
            return expiration_ms
        op.deadline_ms = deadline_ms
        return deadline_ms

    def _check_session(self, group: GroupMetadata, member: MemberMetadata, expired: DelayedHeartbeat) -> None:
        if self.has_satisfied_heartbeat(member):
            return
        now_ms = self.clock.now_ms()
        remaining_ms = member.heartbeat_deadline_ms - now_ms
        if remaining_ms > 0:  # heartbeats arrived since this operation was armed: the same one waits again
            expired.delay_ms = remaining_ms
            expired.deadline_ms = now_ms + remaining_ms
            member.heartbeat_op = expired
            self.heartbeat_purgatory.rearm(expired, member_key(group.group_id, member.member_id))
            return
        log.info("Member %s in group %s has failed, removing it from the group", member.member_id, group.group_id)
        cause = RebalanceCause(RebalanceCategory.SESSION_TIMEOUT,
                               f"removing member {member.member_id} on heartbeat expiration", member.member_id)
        if self.rebalances_on_removal(group):
            self.announce_rebalance(group, cause)
        self.observer.on_member_session_expired(
            group.group_id, member.member_id, member.client_id, member.client_host, member.session_timeout_ms,
            self.clock.now_ms() - member.heartbeat_deadline_ms + member.session_timeout_ms)
        self.observer.on_member_failed(group.group_id, member.member_id, member.group_instance_id,
                                       "session timeout")
        self.remove_member_and_update_group(group, member, cause)
