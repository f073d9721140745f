"""The sync phase of a rebalance (§4.6): members that got their JoinGroup response owe a SyncGroup within the
rebalance timeout (DelayedSync); the leader's assignment, or an error, is propagated to every parked SyncGroup.
Mixed into GroupShard (through Rebalancing), whose rebalance mechanics a sync timeout calls."""
from __future__ import annotations

import logging
from typing import Callable

from coordinator.group.api import SyncGroupResponse
from coordinator.group.delayed import sync_key
from coordinator.group.metadata import GroupMetadata
from coordinator.group.observer import RebalanceCategory, RebalanceCause
from coordinator.group.sessions import SessionTracking
from coordinator.group.state import COMPLETING, DEAD, EMPTY, PREPARING, STABLE
from coordinator.purgatory import DelayedOperation, DelayedOperationPurgatory
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")


class SyncPhase(SessionTracking):
    rebalance_purgatory: DelayedOperationPurgatory[DelayedOperation]

    def prepare_rebalance(self, group: GroupMetadata, cause: RebalanceCause) -> None:
        raise NotImplementedError  # the join phase's (rebalance.py)

    def remove_sync_expiration(self, group: GroupMetadata) -> None:
        group.pending_sync_members.clear()
        self.rebalance_purgatory.check_and_complete(sync_key(group.group_id))

    def remove_pending_sync_member(self, group: GroupMetadata, member_id: str) -> None:
        pending = group.pending_sync_members
        pending.discard(member_id)
        # In CompletingRebalance and Stable the one DelayedSync watched is this generation's (prepare_rebalance
        # completed the one before): it completes once nobody owes a SyncGroup, so a rebalance's SyncGroups ask
        # the purgatory once, not once each. (Identity, not `in` a set: an Enum's hash is a Python call.)
        state = group.state
        if not pending or (state is not COMPLETING and state is not STABLE):
            self.rebalance_purgatory.check_and_complete(sync_key(group.group_id))

    def try_complete_pending_sync(self, group: GroupMetadata, generation_id: int,
                                  force_complete: Callable[[], bool]) -> bool:
        if generation_id != group.generation_id or group.state in (DEAD, EMPTY, PREPARING):
            return force_complete()
        return force_complete() if not group.pending_sync_members else False

    def on_expire_pending_sync(self, group: GroupMetadata, generation_id: int) -> None:
        if self.given_up:  # being unloaded: its parked SyncGroups are answered by the unload
            return
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
        now_ms = self.clock.now_ms()  # once for the group: the same millisecond for every member
        for member in list(group.members.values()):
            response = SyncGroupResponse(error, protocol_type, protocol_name, member.assignment)
            if group.complete_sync(member, response):
                self.schedule_heartbeat(group, member, member.session_timeout_ms, now_ms)
