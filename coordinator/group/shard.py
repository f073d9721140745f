"""GroupShard: the groups of one state-topic partition, its status, and the checks every request handler makes.

A shard owns its groups, its loading status and (through the group ids in them) its purgatory keys. Request
handlers (join.py, sync.py, offsets.py, admin.py) are plain functions of (shard, request) that mutate the shard
and return a `Result` (records to append, response or parked future); the runtime (runtime.py) appends the
records to the shard's partition and answers once Kafka acknowledged them. Nothing here awaits or calls the
store: a write group logic makes on its own (an emptied group's record, from a timer) goes to `shard.append`,
the runtime's same append, queued at once and in order.

The shard is assembled from one module per job, each declaring what it uses of the others: session tracking
(sessions.py), the sync phase (sync_phase.py), the rebalance mechanics (rebalance.py), loading and unloading
of groups (residency.py); this module holds the shard's state and the status and member checks (§3.0).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from coordinator.config import CoordinatorConfig
from coordinator.group.delayed import DelayedHeartbeat
from coordinator.group.metadata import GroupMetadata
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.observer import GroupObserver
from coordinator.group.residency import GroupResidency
from coordinator.group.records import Record, TopicPartition
from coordinator.group.result import Write
from coordinator.group.state import EMPTY
from coordinator.group.status import STATUS_ERRORS, ShardStatus
from coordinator.group.txn_offsets import TransactionalOffsets
from coordinator.group.txn_sequences import ProducerSequences
from coordinator.purgatory import DelayedOperation, DelayedOperationPurgatory
from coordinator.timer import Clock
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")
_ACTIVE = ShardStatus.ACTIVE


def _no_store(write: Write) -> None:
    raise RuntimeError(f"no store to append {len(write.records)} records of group {write.group_id} to")


def _none_unwritten(group_id: str) -> set[TopicPartition]:
    return set()


def _no_unwritten_group_tombstones(group_id: str) -> list[Record]:
    return []


class GroupShard(GroupResidency):
    def __init__(self, partition: int, config: CoordinatorConfig, clock: Clock, wall_clock: Clock,
                 observer: GroupObserver, heartbeat_purgatory: DelayedOperationPurgatory[DelayedHeartbeat],
                 rebalance_purgatory: DelayedOperationPurgatory[DelayedOperation],
                 append: Callable[[Write], object] | None = None,
                 append_in_turn: Callable[[Write], object] | None = None) -> None:
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
        # told when an Empty consumer group gives way to a classic group (join.py; the runtime sets it)
        self.consumer_group_replaced: Callable[[GroupShard, ConsumerGroup], None] = _nothing
        # told when DeleteGroups removed an Empty consumer group (admin.py; the runtime sets it)
        self.consumer_group_deleted: Callable[[str], None] = _nothing_deleted
        self.transactional_offsets = TransactionalOffsets()  # pending until their marker (txn_offsets.py)
        self.producer_sequences = ProducerSequences()  # of client producers' batches we write (txn_sequences.py)
        # what a server handler keeps per shard, gone with it (txn_offset_commit's locks): an attribute, not a weak
        # reference to the shard, which a build compiled by mypyc does not take (scripts/build_compiled.py)
        self.handler_state: dict[str, object] = {}
        # The runtime's append to this shard's partition: the one write path, for a handler's Result and for a
        # write group logic makes on its own (a timer emptied a group) alike, queued in the order made.
        self.append: Callable[[Write], object] = append if append is not None else _no_store
        # The same append at the end of this loop turn, together with the partition's other writes of the turn (one
        # transaction; GroupRuntime.append_in_turn): for writes whose answers can wait for it (heartbeats).
        self.append_in_turn: Callable[[Write], object] = append_in_turn if append_in_turn is not None else self.append
        # The store's: the group's offsets whose tombstone of ours is not acknowledged yet (a deletion asked again
        # writes them again: offsets.remove_with_pending)
        self.unwritten_tombstones: Callable[[str], set[TopicPartition]] = _none_unwritten
        # The store's: the tombstones of the group's own records (not its offsets) whose tombstone of ours is not
        # acknowledged yet (a DeleteGroups asked again once that write failed writes them again:
        # admin.handle_delete_groups)
        self.unwritten_group_tombstones: Callable[[str], list[Record]] = _no_unwritten_group_tombstones
        # DeleteGroups' deletion writes not answered yet, by group: a DeleteGroups of the group meanwhile waits for
        # that write (admin.handle_delete_groups), as Kafka defers it until the pending write is committed
        self.deletions_unanswered: dict[str, Write] = {}
        self.heartbeat_count = 0  # heartbeats are counted, never traced (metrics read the runtime's sum)
        self._offset_write_seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None  # the running loop new_future() last found

    def new_future(self) -> asyncio.Future[Any]:
        """`asyncio.get_running_loop().create_future()` without a system call per request: CPython's
        get_running_loop() calls getpid() each time (a loop running before a fork is not the child's), one syscall
        per JoinGroup and SyncGroup (strace: 2,032 getpid a 1,000-member rebalance). The loop found last is kept
        while it runs; one loop owns the shard's state, and a loop that stopped (a test's next asyncio.run) is
        looked up again, as is the first."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop.create_future()

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
        status = self.status
        # identity first: looking an Enum up in a dict calls its Python __hash__ (every group request asks)
        return None if status is _ACTIVE else STATUS_ERRORS.get(status)

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


def _nothing(shard: GroupShard, group: ConsumerGroup) -> None:
    pass


def _nothing_deleted(group_id: str) -> None:
    pass
