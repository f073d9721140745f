"""Groups arriving on and leaving this coordinator (§7.4, §7.5): a loaded group's records replayed into a group
whose members' sessions start now, and the one funnel that answers every parked request of a group unloaded.
Mixed into GroupShard.

A shard given up (UNOWNED, or STOPPED at shutdown) unloads its groups a group at a time (`unload_stepwise`), the
runtime yielding to the loop between slices. Its status is set first, so no request reaches a group meanwhile (every
handler checks it), and the timers of its groups do nothing (`given_up`: a session's expiry, a join phase's
completion, a pending sync's expiry; sessions.py, rebalance.py, sync_phase.py): a group not reached yet stays as the
unload found it, and its parked requests are answered as if every group had been unloaded at once. The runtime holds
the outcomes of the partition's writes until the unload is done (GroupRuntime.unload, give_up, shutdown)."""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from coordinator.group.api import JoinGroupResponse, SyncGroupResponse
from coordinator.group.delayed import join_key, member_key
from coordinator.group.loading import materialize_group
from coordinator.group.metadata import GroupMetadata
from coordinator.group.observer import RebalanceCategory, RebalanceCause
from coordinator.group.rebalance import Rebalancing
from coordinator.group.records import Record
from coordinator.group.state import DEAD, PREPARING
from coordinator.group.status import ShardStatus
from coordinator.group.txn_offsets import TransactionalOffsets
from coordinator.group.txn_sequences import ProducerSequences
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")


class GroupResidency(Rebalancing):
    status: ShardStatus
    groups: dict[str, GroupMetadata]
    transactional_offsets: TransactionalOffsets
    producer_sequences: ProducerSequences

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

    def unload_stepwise(self, error: Errors = Errors.NOT_COORDINATOR) -> Iterator[int]:
        """Every group unloaded, and the shard's transactional state forgotten, a group at a time, for a caller
        that yields to the loop between slices (the runtime): after
        each group, how many groups and members it unloaded. The shard is given up first (UNOWNED or STOPPED), or
        what is not reached yet may still be served and its timers act. A group that left meanwhile is skipped, one
        that arrived meanwhile is unloaded too."""
        while self.groups:
            # taken off the list as they go: a group unloaded is freed in its own slice, not the whole shard's at
            # the end, when the list would go (25,000 members: ~8 ms in one loop callback)
            waiting = list(self.groups.values())
            waiting.reverse()
            while waiting:
                group = waiting.pop()
                if self.groups.get(group.group_id) is group:
                    self.unload_group(group, error)
                    yield 1 + len(group.members) + len(group.pending_members)
        self.transactional_offsets.clear()  # the next owner rebuilds them (and the sequences) from the log
        self.producer_sequences.forget()
