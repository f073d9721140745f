"""The consumer groups of every shard: ConsumerGroupHeartbeat and ConsumerGroupDescribe, the session and rebalance
timers on the timing wheel, and the records each change produces.

Each change is computed as records (heartbeat.py), replayed onto the group at once (so the next request sees it,
as Kafka's runtime replays before the write completes) and written to the shard's state-topic partition as one
`Write`: a heartbeat is answered once it is acknowledged (the runtime awaits it), a timer's fence is queued in
order with everything else. Loading replays the same records (`load`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.config import CoordinatorConfig
from coordinator.group.assignor.java_order import hash_order, string_hash
from coordinator.group.modern.group import ConsumerGroup, GroupUndo
from coordinator.group.modern.errors import ApiError
from coordinator.group.modern.group_configs import GroupConfig, GroupConfigs
from coordinator.group.errors import kafka4_append_error
from coordinator.group.modern.heartbeat import (HeartbeatRequest, HeartbeatResponse, PendingTarget, Settings,
                                                answer_pending, fence, heartbeat, steady_heartbeat, validate)
from coordinator.group.api import (JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
                                   SyncGroupRequest, SyncGroupResponse)
from coordinator.group.loading import materialize_group
from coordinator.group.replacement_hold import held_by_members, move_holds
from coordinator.group.member import answer_parked
from coordinator.group.metadata import GroupMetadata
from coordinator.group.modern.classic import classic_heartbeat, classic_join, classic_leave, classic_sync
from coordinator.group.modern.conversion import (classic_group_from, consumer_group_records,
                                                 consumer_group_tombstones, converted, is_convertible,
                                                 validate_online_downgrade, validate_online_downgrade_with_replaced,
                                                 validate_online_upgrade)
from coordinator.group.observer import RebalanceCategory, RebalanceCause
from coordinator.group.records import GroupMetadataRecord, GroupRecord, Record
from coordinator.group.modern.member import LEAVE_GROUP_MEMBER_EPOCH, MemberState
from coordinator.group.modern.observing import ConsumerGroupWatch, Fenced
from coordinator.group.modern.steady import SteadyMember
from coordinator.group.modern.regex import DescribableTopics, Refresh, resolution_records, resolve
from coordinator.group.modern.records import (PER_MEMBER_TYPES, ConsumerGroupRecord, CurrentAssignmentRecord,
                                              GroupEpochRecord, MemberMetadataRecord, Partitions, RecordType,
                                              TargetAssignmentEpochRecord, TargetAssignmentRecord, Tombstone)
from coordinator.topics import StaticTopics, TopicsView
from coordinator.group.result import Write
from coordinator.group.shard import GroupShard
from coordinator.rewrite_backoff import FIRST_RETRY_MS, next_retry_ms
from coordinator.group.status import STATUS_ERRORS as _STATUS_ERRORS, ShardStatus
from coordinator.group.state import GroupState
from coordinator.timer import CallbackTask, Clock, SystemTimer
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")


_AS_NOW = object()
# Kafka 4.1's reason for a consumer group member's session expiry (its line ends "... session expired.")
_SESSION_EXPIRED = Fenced("the member session expired.", RebalanceCategory.SESSION_TIMEOUT)
# a member whose join was not written, fenced once a later write kept it in memory (_undo_joins)
_JOIN_NOT_WRITTEN = Fenced("its join was not written.", RebalanceCategory.ASSIGNMENT_STORE_FAILED)
# a loaded member that records written after it assumed gone or changed: a write in between was lost (load)
_WRITTEN_OVER = Fenced("the log holds later records that assumed it gone or changed (a write was lost).",
                       RebalanceCategory.ASSIGNMENT_STORE_FAILED)
# Kafka's answers to an append that mean its records are not in the log
_NOT_APPENDED = frozenset({Errors.NOT_ENOUGH_REPLICAS, Errors.NOT_LEADER_OR_FOLLOWER, Errors.MESSAGE_TOO_LARGE,
                           Errors.RECORD_LIST_TOO_LARGE, Errors.CORRUPT_MESSAGE,
                           Errors.INVALID_REQUIRED_ACKS, Errors.UNKNOWN_TOPIC_OR_PARTITION})


class _MemberTimer(CallbackTask):
    __slots__ = ("timeout_ms",)

    def __init__(self, delay_ms: int, callback: Callable[[], None]) -> None:
        super().__init__(delay_ms, callback)
        self.timeout_ms = delay_ms  # as armed (a session timer waiting again has a shorter delay_ms)


class SessionTimer(_MemberTimer):
    """A consumer-protocol member's session: in the timer once per session timeout, its deadline moved by each
    heartbeat with one write (`deadline_ms`), as the classic DelayedHeartbeat's (group/sessions.py). Fired before
    the deadline, it waits again for the rest; at the deadline the member is fenced, as if every heartbeat had
    rescheduled it. `live` is False once it fired or was cancelled (the steady path's check)."""

    __slots__ = ("deadline_ms", "_armed_ms", "_timer", "live")

    def __init__(self, timer: SystemTimer, timeout_ms: int, callback: Callable[[], None]) -> None:
        super().__init__(timeout_ms, callback)
        self._timer = timer
        self.deadline_ms = self._armed_ms = timer.clock.now_ms() + timeout_ms
        self.live = True

    def move(self, now_ms: int) -> None:
        """A heartbeat at `now_ms`: the session ends a timeout later."""
        self.deadline_ms = now_ms + self.timeout_ms

    def run(self) -> None:
        if self.deadline_ms > self._armed_ms:  # heartbeats came since it was armed: it waits for the rest
            now_ms = self._timer.clock.now_ms()
            self.delay_ms = max(self.deadline_ms - now_ms, 0)
            self._armed_ms = self.deadline_ms
            self._timer.add(self)
            return
        self.live = False
        self.callback()

    def cancel(self) -> None:
        self.live = False
        super().cancel()


@dataclass(slots=True)
class _Repair:
    """A group's repair write that Kafka refused (`ConsumerGroupService._written`), owed until one is acknowledged:
    the keys to write again as memory has them (`records`), sent when `timer` fires or with the group's next write
    if that comes first (`_carry_repair`; `timer` None: a resend is in flight), each next wait twice the last
    (rewrite_backoff.py). `standing_in`: while it waits, memory holds what the log
    may not and nothing is in flight to put it there; an answer read from memory waits for this (its `done`
    resolves with the resend's outcome: `unacknowledged`), as it waits for a write in flight."""

    shard: GroupShard
    records: list[ConsumerGroupRecord]
    standing_in: Write
    delay_ms: int = FIRST_RETRY_MS
    timer: _MemberTimer | None = None


def _settle_stand_in(standing_in: Write, error: Errors) -> None:
    """An owed repair's outcome to the answers waiting for it: what they registered on its stand-in
    (`then_also`) runs now, in the turn of the write that carried the repair and in order with its own answers,
    then its `done` resolves. Once only."""
    done = standing_in.done
    if done is None or done.done():
        return
    try:
        if standing_in.then is not None:
            standing_in.then(error)
    finally:
        done.set_result(error)


@dataclass(frozen=True, slots=True)
class DescribedPartitions:
    topic_id: uuid.UUID
    topic_name: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: tuple[DescribedPartitions, ...]
    target_assignment: tuple[DescribedPartitions, ...]
    member_type: int = 1  # KIP-1099: 1 = consumer protocol


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error: Errors = Errors.NONE
    message: str | None = None
    state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: tuple[DescribedMember, ...] = field(default_factory=tuple)


@dataclass(slots=True)
class _TargetBatch:
    """The heartbeats of one group that found its epoch ahead of the assignment epoch within one loop turn: their
    records replayed and kept here, their answers waiting for the target they share (`_settle_batch`)."""

    shard: GroupShard
    before: GroupUndo | None  # the group as the batch's first heartbeat found it (None: no group)
    records: list[ConsumerGroupRecord] = field(default_factory=list)
    waiting: list[tuple[PendingTarget, asyncio.Future[HeartbeatResponse]]] = field(default_factory=list)


class ServiceChecks(Protocol):
    """What a checker of the service's promises (the simulator's invariants, simulator/instance.py) is told besides
    the observer's events, each where the promise is kept or judged: a heartbeat's answer (whether it restarted the
    member's session), a load's end (every loaded member's session starts again), a timer about to fence a member
    (whether its session really ran out), a classic member's SyncGroup answered by the consumer group.
    `ConsumerGroupService.checks`, None by default: then each place costs a None check."""

    def heartbeat_answered(self, request: HeartbeatRequest,
                           answer: HeartbeatResponse | asyncio.Future[HeartbeatResponse]) -> None: ...

    def loaded(self, shard: GroupShard) -> None: ...

    def fencing(self, group_id: str, member_id: str, at_epoch: int | None, reason: Fenced,
                kind: str | None) -> None: ...  # before anything is changed; `_fence_expired`'s arguments

    def classic_synced(self, group: ConsumerGroup, response: SyncGroupResponse) -> None: ...


class ConsumerGroupService:
    def __init__(self, config: CoordinatorConfig, timer: SystemTimer, shard_for: Callable[[str], GroupShard],
                 topics: TopicsView | None = None, wall_clock: Clock | None = None) -> None:
        self.config = config
        self.timer = timer
        self.shard_for = shard_for
        self.topics: TopicsView = topics if topics is not None else StaticTopics()
        self.wall_clock = wall_clock if wall_clock is not None else timer.clock
        # how every topic of the cluster is learnt before regular expressions are resolved (the relay's); None:
        # the topics `topics` has are all there is
        self.refresh_all_topics: Callable[[], Awaitable[object]] | None = None
        self._resolving: dict[str, asyncio.Task[None]] = {}  # group id -> its regular expressions' resolution
        self._write_sequence: dict[str, int] = {}  # group id -> its latest write not yet acknowledged
        self._last_sequence = 0
        # group id -> (its latest write not yet acknowledged, its number); and how many of its writes failed
        self._unacknowledged: dict[str, tuple[Write, int]] = {}
        self._failures: dict[str, int] = {}
        # group id -> its latest write, the undo point of that write and its records, while records of the same loop
        # turn may still join it (`_apply`'s join_open; the runtime sends it at the end of the turn)
        self._open: dict[str, tuple[Write, GroupUndo | None, list[ConsumerGroupRecord]]] = {}
        assignors = config.consumer_group_assignor_names
        self.settings = Settings(config.group_consumer_heartbeat_interval_ms, config.group_consumer_max_size,
                                 # GroupCoordinatorService lists them from a HashSet of their names
                                 assignors=tuple(hash_order(assignors, string_hash)), default_assignor=assignors[0],
                                 metadata_refresh_interval_ms=config.group_consumer_heartbeat_interval_ms,
                                 regex_refresh_interval_ms=config.group_consumer_regex_refresh_interval_ms)
        self._settings_by_interval = {config.group_consumer_heartbeat_interval_ms: self.settings}
        # each group's consumer.session.timeout.ms / consumer.heartbeat.interval.ms (group_configs.py); read from
        # the cluster once `group_configs.describe` is set
        self.group_configs = GroupConfigs(config, timer.clock)
        self.group_configs.on_change = self._group_config_changed
        self._armed_unconfigured: set[str] = set()  # groups loaded before their configuration was read
        # the configuration the heartbeat being answered looked up, for its session timer (one lookup per
        # heartbeat); forgotten when that group's configuration changes
        self._heartbeat_group: str | None = None
        self._heartbeat_config = self.group_configs.defaults
        self._timers: dict[tuple[str, str, str], _MemberTimer] = {}
        # what each change tells the shard's observer
        self.watch = ConsumerGroupWatch(self.wall_clock.now_ms, default_assignor=self.settings.default_assignor)
        self.steady_shortcut = True  # False: every heartbeat takes the full path (equivalence tests, benches)
        # True (the runtime's): the heartbeats of a group that find its target to compute within one loop turn
        # share one computation and are answered after it (`heartbeat` then answers them with a future)
        self.batch_targets = False
        self._batches: dict[str, _TargetBatch] = {}  # group id -> its heartbeats waiting for the shared target
        self._repairs: dict[str, _Repair] = {}  # group id -> its refused repair write, sent again with a backoff
        self.checks: ServiceChecks | None = None  # told what a checker judges (the simulator's); None: nobody

    # --- requests ---------------------------------------------------------------------------------------------
    def steady_heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse | None:
        """The answer to a heartbeat that changes nothing (heartbeat.steady_heartbeat), with none of the full path's
        work; None when it may change something, or is answered with an error: `heartbeat` answers it."""
        if not self.steady_shortcut:
            return None
        try:
            validate(request, self.settings)
        except ApiError:
            return None
        shard = self.shard_for(request.group_id)
        group = shard.consumer_groups.get(request.group_id)
        if group is None or shard.status is not ShardStatus.ACTIVE or is_convertible(shard.groups.get(
                request.group_id)):
            return None
        now_ms = self.timer.clock.now_ms()
        return steady_heartbeat(group, request, self.topics, self._settings_of(request.group_id, now_ms), self,
                                now_ms)

    def steady_member(self, group_id: str, member_id: str,
                      topics_ready: Callable[[Collection[str]], bool] = lambda _names: True) -> SteadyMember | None:
        """What a steady heartbeat the shortcut has just answered was answered from (steady.py), to answer the
        member's next ones while none of it changes; None when there is nothing to keep (not a consumer-protocol
        member in the steady state, the group's configuration not read). `topics_ready`: whether the subscribed
        topics may be looked at again (the runtime's: each known to the cluster view)."""
        shard = self.shard_for(group_id)
        group = shard.consumer_groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if (group is None or member is None or member.classic is not None or not self.steady_shortcut
                or not member.is_reconciled_to(group.assignment_epoch) or group.group_epoch > group.assignment_epoch):
            return None
        if not self.group_configs.known(group_id):
            return None
        config = self.group_configs.get(group_id, self.timer.clock.now_ms())
        session = self._timers.get(("session", group_id, member_id))
        if (type(session) is not SessionTimer or not session.live
                or session.timeout_ms != config.session_timeout_ms):
            return None
        return SteadyMember(self, shard, group, member, config, session, topics_ready)

    def heartbeat(self, request: HeartbeatRequest
                  ) -> tuple[HeartbeatResponse | asyncio.Future[HeartbeatResponse], Write | None]:
        """The response, and the write to await before sending it (None: nothing changed); with `batch_targets`,
        a heartbeat whose group has a target to compute is answered by a future instead, resolved once the target
        its batch shares is computed and written (`_settle_batch`)."""
        steady = self.steady_heartbeat(request)
        if steady is not None:
            if self.checks is not None:
                self.checks.heartbeat_answered(request, steady)
            return steady, None
        answer, write = self._heartbeat(request)
        if self.checks is not None:
            self.checks.heartbeat_answered(request, answer)
        return answer, write

    def _heartbeat(self, request: HeartbeatRequest
                   ) -> tuple[HeartbeatResponse | asyncio.Future[HeartbeatResponse], Write | None]:
        """`heartbeat` of one the steady shortcut does not answer."""
        if request.member_epoch < 0:  # a leave is written after the changes the group's batch holds
            self._settle_batch(request.group_id)
        try:
            validate(request, self.settings)
            shard = self.shard_for(request.group_id)
            status_error = _STATUS_ERRORS.get(shard.status)
            if status_error is not None:
                return HeartbeatResponse(status_error), None
            group = shard.consumer_groups.get(request.group_id)
            classic = shard.groups.get(request.group_id)
            conversion: list[ConsumerGroupRecord] = []
            if is_convertible(classic):
                assert classic is not None
                if request.member_epoch != 0:
                    raise ApiError(Errors.GROUP_ID_NOT_FOUND, f"Group {request.group_id} is not a consumer group.")
                validate_online_upgrade(classic, self.config.group_consumer_migration_policy,
                                        self.config.group_consumer_max_size)
                conversion = consumer_group_records(classic, self.topics)
                group = converted(request.group_id, conversion)
            if (group is not None and request.member_epoch == LEAVE_GROUP_MEMBER_EPOCH
                    and self._downgrades(group, request)):
                log.info("[GroupId %s] Member %s left the consumer group.", group.group_id, request.member_id)
                return (HeartbeatResponse(member_id=request.member_id, member_epoch=request.member_epoch),
                        self._downgrade(shard, group, request.member_id, self._left(group, request.member_id)))
            now_ms = self.timer.clock.now_ms()
            # a heartbeat of a group not here is refused: its configuration is not worth reading
            settings = self.settings if group is None and request.member_epoch != 0 else self._settings_of(
                request.group_id, now_ms)
            result = heartbeat(group, request, self.topics, settings, self, now_ms, self.wall_clock.now_ms(),
                               defer_target=self.batch_targets and not conversion)
        except ApiError as exc:
            return HeartbeatResponse(exc.error, exc.message), None
        if conversion:
            assert classic is not None
            return result.response, self._upgrade(shard, classic, conversion + result.records)
        if result.created is not None and classic is not None and (classic.protocol_type is not None
                                                                   or classic.generation_id > 0):
            # An Empty classic group gives way (Kafka's maybeDeleteEmptyClassicGroup; not a mere offsets' holder,
            # which has no record): its record goes, or a reload
            # makes it again beside the consumer group (a failed upgrade's group, mid-rebalance, still has one:
            # seed 361 of --protocol upgrade)
            shard.observer.on_group_replaced(request.group_id, "consumer")
            self._tombstone_classic(shard, request.group_id, None)
        answer: HeartbeatResponse | asyncio.Future[HeartbeatResponse] = result.response
        write = None
        if result.pending is not None:
            answer = self._batched(shard, request.group_id, result.records, result.created, result.pending)
        else:
            before = shard.consumer_groups.get(request.group_id)
            snapshot = before.undo_point() if before is not None and result.records else None
            if result.created is not None and result.records:
                shard.consumer_groups[request.group_id] = result.created
            write = self._apply(shard, request.group_id, result.records, snapshot, join_open=True)
        if result.refresh_regexes and request.group_id not in self._resolving:
            task = asyncio.get_running_loop().create_task(
                self._resolve(shard, request.group_id, result.refresh_regexes,
                              describable=request.describable_topics))
            self._resolving[request.group_id] = task
            task.add_done_callback(lambda _done: self._resolving.pop(request.group_id, None))
        return answer, write

    # --- one target per group per loop turn -------------------------------------------------------------------
    def _batched(self, shard: GroupShard, group_id: str, records: list[ConsumerGroupRecord],
                 created: ConsumerGroup | None, pending: PendingTarget) -> asyncio.Future[HeartbeatResponse]:
        """A heartbeat that stopped before its group's target: its records replayed now (the group's next request
        sees them) and kept for the batch's write, its answer the batch's. The batch is settled at the start of
        the next loop turn, after every request this turn read, or earlier by any other change of the group."""
        loop = asyncio.get_running_loop()
        batch = self._batches.get(group_id)
        if batch is None:
            current = shard.consumer_groups.get(group_id)
            batch = self._batches[group_id] = _TargetBatch(shard, current.undo_point() if current is not None
                                                           else None)
            loop.call_soon(self._settle_batch, group_id)
            if shard.expect_write is not None:  # the batch's write comes after the target's CPU: its transaction
                shard.expect_write()            # registers the partition with Kafka's coordinator meanwhile
        if created is not None and group_id not in shard.consumer_groups and records:
            shard.consumer_groups[group_id] = created
        if batch.before is not None:
            batch.before.capture(records)
        for record in records:
            self.replay(shard, record)
        batch.records.extend(records)
        answer: asyncio.Future[HeartbeatResponse] = loop.create_future()
        batch.waiting.append((pending, answer))
        return answer

    def _settle_batch(self, group_id: str) -> None:
        """The group's batch, if any: its target computed once and every waiting member reconciled towards it
        (heartbeat.answer_pending), the whole batch one write; each member answered once it is acknowledged."""
        batch = self._batches.pop(group_id, None)
        if batch is None:
            return
        shard, waiting = batch.shard, batch.waiting
        group = shard.consumer_groups.get(group_id)
        status_error = _STATUS_ERRORS.get(shard.status)
        try:
            if status_error is not None or group is None:  # unloaded meanwhile: nothing of it is written
                raise ApiError(status_error or Errors.NOT_COORDINATOR)
            if batch.before is not None:  # what answer_pending replays: the targets, the waiting members
                batch.before.capture_targets()
                for pending, _ in waiting:
                    batch.before.capture_member(pending.member_id)
            responses = answer_pending(group, [pending for pending, _ in waiting], self.topics, self, batch.records,
                                       default_assignor=self.settings.default_assignor)
        except ApiError as exc:
            if shard.status is ShardStatus.ACTIVE:
                self._restore(shard, group_id, batch.before)
            for _, answer in waiting:
                if not answer.done():
                    answer.set_result(HeartbeatResponse(exc.error, exc.message))
            return
        write = self._apply(shard, group_id, batch.records, batch.before, replayed=True)
        if write is None:
            self._answer(waiting, responses, Errors.NONE)
            return
        write.then_also(lambda error: self._answer(waiting, responses, error))
        shard.append_in_turn(write)

    @staticmethod
    def _answer(waiting: Sequence[tuple[PendingTarget, asyncio.Future[HeartbeatResponse]]],
                responses: Sequence[HeartbeatResponse], error: Errors) -> None:
        for index, (_, answer) in enumerate(waiting):
            if not answer.done():
                response = responses[index] if index < len(responses) else HeartbeatResponse(error)
                answer_parked(answer, response if error == Errors.NONE
                              else HeartbeatResponse(kafka4_append_error(error)))

    def _restore(self, shard: GroupShard, group_id: str, before: GroupUndo | None) -> None:
        """The group back as `before` had it (None: no group); the timers of members it no longer has go (a
        reverted join's session: fired, it would find nothing, but an unload only cancels the members' it has)."""
        current = shard.consumer_groups.get(group_id)
        members = list(current.members) if current is not None else []  # (the undo restores the group in place)
        if before is None:
            shard.consumer_groups.pop(group_id, None)
        else:
            shard.consumer_groups[group_id] = before.restore()
        restored = shard.consumer_groups.get(group_id)
        for member_id in members:
            if restored is None or member_id not in restored.members:
                self.cancel_all(group_id, member_id)

    # --- classic members inside a consumer group (classic.py) ----------------------------------------------------
    def classic_join(self, group: ConsumerGroup, req: JoinGroupRequest
                     ) -> tuple[JoinGroupResponse, Write | None, Callable[[], None] | None]:
        """The response, the write to await before sending it, and what to arm once it is written."""
        self._settle_batch(req.group_id)
        shard = self.shard_for(req.group_id)
        policy, classic_max_size = self.config.group_consumer_migration_policy, self.config.group_max_size
        try:
            result = classic_join(group, req, self.topics, self.settings, self, self.timer.clock.now_ms(),
                                  lambda replaced: validate_online_downgrade_with_replaced(group, replaced, policy,
                                                                                           classic_max_size))
        except ApiError as exc:
            return JoinGroupResponse(exc.error, member_id=req.member_id), None, None
        if result.downgrade:
            reason = (f"Downgrade group {group.group_id} from consumer to classic for static member replacement with "
                      "different subscription.")
            return result.response, self._downgrade(shard, group, None, RebalanceCause(
                RebalanceCategory.STATIC_MEMBER, reason, result.response.member_id), first=result.records), result.then
        return result.response, self._apply(shard, req.group_id, result.records), result.then

    def classic_sync(self, group: ConsumerGroup, req: SyncGroupRequest) -> SyncGroupResponse:
        try:
            response = classic_sync(group, req, self.topics, self)
        except ApiError as exc:
            response = SyncGroupResponse(exc.error)
        if self.checks is not None:
            self.checks.classic_synced(group, response)
        return response

    def classic_heartbeat(self, group: ConsumerGroup, member_id: str, generation_id: int,
                          instance_id: str | None) -> Errors:
        return classic_heartbeat(group, member_id, generation_id, instance_id, self)

    def classic_leave(self, group: ConsumerGroup, req: LeaveGroupRequest) -> tuple[LeaveGroupResponse, Write | None]:
        self._settle_batch(req.group_id)
        records, response = classic_leave(group, req.members, self.topics, self)
        return response, self._apply(self.shard_for(req.group_id), req.group_id, records)

    def _upgrade(self, shard: GroupShard, classic: GroupMetadata, records: list[ConsumerGroupRecord]) -> Write:
        """The classic group gives way (its parked JoinGroup/SyncGroup answered REBALANCE_IN_PROGRESS, its
        heartbeats stopped, its offsets kept) and the consumer group its records describe takes its place. If the
        write fails, the consumer group goes and the classic group comes back as its last record has it (Stable;
        one caught mid-rebalance has no such record: its members rejoin an empty group), a static replacement
        whose own write is undecided included: that write's outcome decides it there (replacement_hold.py)."""
        group_id = classic.group_id
        # what the state topic still says of the classic group, to go back to if the write fails
        last_written = classic.to_record({m.member_id: m.assignment for m in classic.members.values()}) \
            if classic.is_in(GroupState.STABLE) else None
        shard.observer.on_group_converted(group_id, "consumer", classic.generation_id, classic.state.value)
        shard.unload_group(classic, Errors.REBALANCE_IN_PROGRESS)
        holder = shard.add_group(group_id)  # the offsets' holder, as a load makes it
        classic.hand_offsets_to(holder)
        shard.consumer_groups[group_id] = ConsumerGroup(group_id)
        write = self._apply(shard, group_id, records, None, written_first=[GroupMetadataRecord(group_id, None)],
                            already_members=classic.members.keys())
        assert write is not None and write.then is not None
        revert_consumer_group = write.then

        def written(error: Errors) -> None:
            revert_consumer_group(error)
            if error != Errors.NONE and group_id in shard.consumer_groups:
                # Not reverted: a later write of the consumer group was computed on top of this one and may be in
                # the log (`_written` rewrites its records). The classic group's record must go again too, or a
                # reload finds a classic group beside the consumer group (the classic one wins the next join).
                self._tombstone_classic(shard, group_id, error)
                return
            if (error != Errors.NONE and last_written is not None and group_id not in shard.consumer_groups
                    and shard.groups.get(group_id) is holder and shard.status is ShardStatus.ACTIVE):
                restored = materialize_group(group_id, [GroupMetadataRecord(group_id, last_written)],
                                             shard.now_wall_ms(), shard.observer)
                holder.hand_offsets_to(restored)
                shard.groups[group_id] = restored
                shard.observer.on_group_converted(group_id, "classic", restored.generation_id, restored.state.value)
                for member in restored.members.values():
                    shard.schedule_heartbeat(restored, member, member.session_timeout_ms)
                move_holds(classic, restored)  # a static replacement still undecided is decided against it
                log.warning("event=upgrade_reverted group=%s error=%s", group_id, error.name)
                self._rewrite_classic(shard, group_id, last_written, error)
            elif (error != Errors.NONE and group_id not in shard.consumer_groups
                    and shard.groups.get(group_id) is holder and shard.status is ShardStatus.ACTIVE
                    and holder.is_in(GroupState.EMPTY) and not holder.members):
                # Caught mid-rebalance (no record to go back to): its members rejoin the Empty holder, whose
                # generations go on from the classic group's, as Kafka's reverted classic group's do (a generation
                # is never Stable twice: seed 207 of --protocol upgrade)
                holder.generation_id = max(holder.generation_id, classic.generation_id)
                holder.protocol_type = holder.protocol_type or classic.protocol_type
                shard.observer.on_group_converted(group_id, "classic", holder.generation_id, holder.state.value)
                log.warning("event=upgrade_reverted group=%s error=%s", group_id, error.name)
                self._rewrite_classic(shard, group_id, holder.to_record({}), error)

        write.then = written
        # The conversion's records carry every member's id: they hold the revert of a static replacement whose write
        # is undecided (its new id acknowledged here, the replacement stands; failed, it is reverted on `restored`).
        held_by_members(classic, classic.members.keys(), write)
        group = shard.consumer_groups[group_id]
        for member_id in classic.members:
            member = group.members.get(member_id)
            if member is not None and member.classic is not None:
                self.schedule_classic_session(group_id, member_id, member.classic.session_timeout_ms)
        log.info("[GroupId %s] Converted the classic group to a consumer group.", group_id)
        return write

    def _rewrite_classic(self, shard: GroupShard, group_id: str, record: GroupRecord, error: Errors) -> None:
        """The classic group a failed upgrade put back, written again when the upgrade's write may have landed
        (timed out, not refused before the append): that write began with the classic group's tombstone, and a
        reload of a log holding it makes no classic group, so its generations would start again at 1 while its
        members still hold the old ones' partitions (seed 1828 of --protocol upgrade: generation 1 Stable twice,
        one partition owned by two members). Kafka's failed append leaves the classic record in its log."""
        if error in _NOT_APPENDED or shard.status is not ShardStatus.ACTIVE or error == Errors.NOT_COORDINATOR:
            return
        log.warning("event=upgrade_classic_rewritten group=%s error=%s", group_id, error.name)
        shard.append(Write(group_id, [GroupMetadataRecord(group_id, record)]))

    def _tombstone_classic(self, shard: GroupShard, group_id: str, error: Errors | None) -> None:
        """The classic group's tombstone, for a consumer group made over an Empty classic group (`error` None) or
        again for an upgrade whose write failed while the consumer group stayed. Not retried here: the Kafka
        store keeps a failed tombstone owed and sends it again, with a backoff, until a newer write of its key
        (storage/tombstones.py); a retry per failure from here would be a write storm when the cluster refuses
        fast (authorization)."""
        if shard.status is not ShardStatus.ACTIVE or error == Errors.NOT_COORDINATOR:
            return  # the partition is another instance's now: its load decides
        if error is not None:
            log.warning("event=upgrade_tombstone_rewritten group=%s error=%s", group_id, error.name)
        shard.append(Write(group_id, [GroupMetadataRecord(group_id, None)]))

    def _downgrades(self, group: ConsumerGroup, request: HeartbeatRequest) -> bool:
        """Whether this leave (-1) is the last consumer-protocol member's and takes the group back to classic."""
        member = group.members.get(request.member_id)
        if member is None or (request.instance_id is not None and member.instance_id != request.instance_id):
            return False  # the usual errors (heartbeat.leave)
        return validate_online_downgrade(group, member.member_id, self.config.group_consumer_migration_policy,
                                         self.config.group_max_size)

    @staticmethod
    def _left(group: ConsumerGroup, member_id: str, fenced: Fenced | None = None) -> RebalanceCause:
        """Kafka's reason for the classic group's rebalance when the last consumer-protocol member goes, whether it
        left or a timer fenced it (the category says which)."""
        return RebalanceCause(RebalanceCategory.MEMBER_LEFT if fenced is None else fenced.category,
                              f"Downgrade group {group.group_id} from consumer to classic for member leaving.",
                              member_id)

    def _downgrade(self, shard: GroupShard, group: ConsumerGroup, leaving_member_id: str | None,
                   cause: RebalanceCause, first: Sequence[ConsumerGroupRecord] = (), *,
                   fenced: Fenced | None = None) -> Write:
        """The consumer group's tombstones and the classic group's record, written together (after `first`, the
        records of the join that brings it about); the classic group (holding the group's offsets) takes its place
        at once and rebalances for `cause`. `fenced`: why the leaving member went, when a timer fenced it."""
        group_id = group.group_id
        final = group
        if first:  # the group as those records leave it: the classic group is made of it
            final = group.snapshot()
            for change in first:
                final.replay(change)
        classic = classic_group_from(final, leaving_member_id, self.topics, shard.now_wall_ms(), shard.observer)
        holder = shard.groups.get(group_id)
        if holder is not None:
            holder.hand_offsets_to(classic)
        record = classic.to_record({m.member_id: m.assignment for m in classic.members.values()})
        for member_id in {*group.members, *final.members}:
            self.cancel_all(group_id, member_id)
        write = self._apply(shard, group_id, [*first, *consumer_group_tombstones(final)],
                            written_last=[GroupMetadataRecord(group_id, record)], fenced=fenced,
                            carried_over=classic.members.keys())
        assert write is not None and write.then is not None
        revert_consumer_group = write.then

        def written(error: Errors) -> None:
            revert_consumer_group(error)
            if error != Errors.NONE and group_id in shard.consumer_groups and shard.groups.get(group_id) is classic:
                shard.observer.on_group_converted(group_id, "consumer", classic.generation_id, classic.state.value)
                shard.unload_group(classic, Errors.REBALANCE_IN_PROGRESS)
                if holder is not None:
                    classic.hand_offsets_to(holder)  # with the commits answered meanwhile
                    shard.groups[group_id] = holder  # the consumer group's offsets, as before
                log.warning("event=downgrade_reverted group=%s error=%s", group_id, error.name)
                if error not in _NOT_APPENDED:
                    # the write may have landed, its classic record with it: tombstoned, or a reload makes the
                    # classic group (the consumer group's records are written again by `_written`; seed 745 of
                    # --protocol upgrade)
                    self._tombstone_classic(shard, group_id, error)

        write.then = written
        shard.groups[group_id] = classic
        shard.observer.on_group_converted(group_id, "classic", classic.generation_id, classic.state.value)
        for member in classic.members.values():
            shard.schedule_heartbeat(classic, member, member.session_timeout_ms)
        shard.prepare_rebalance(classic, cause)
        log.info("[GroupId %s] Converted the consumer group to a classic group.", group_id)
        return write

    async def _resolve(self, shard: GroupShard, group_id: str, refresh: Refresh, *,
                       describable: DescribableTopics | None = None) -> None:
        """A group's regular expressions resolved against every topic, after the heartbeat that asked for it
        (Kafka runs it on its executor, then writes the outcome as the group's records)."""
        if self.refresh_all_topics is not None:
            try:
                await self.refresh_all_topics()
            except Exception as exc:  # the cluster unreachable: resolve against what we know
                log.warning("event=topic_listing_failed group=%s error=%r", group_id, exc)
        self._settle_batch(group_id)
        group = shard.consumer_groups.get(group_id)
        if group is None or shard.status is not ShardStatus.ACTIVE:
            return
        if not refresh.forced and self.topics.version <= group.last_regex_version:
            return  # no topic came or went since the last resolution
        started = time.monotonic()
        names = list(self.topics.names())
        resolved = resolve(refresh.regexes, names, describable=describable)
        log.info("[GroupId %s] Scanned %d topics to refresh regular expressions [%s] in %dms.", group_id, len(names),
                 ", ".join(sorted(refresh.regexes)), (time.monotonic() - started) * 1000)
        write = self._apply(shard, group_id, resolution_records(group, resolved, self.topics.version,
                                                                self.wall_clock.now_ms(), self.topics))
        if write is not None:
            shard.append(write)

    async def drain(self) -> None:
        """Waits for the resolutions under way (tests, shutdown)."""
        while self._resolving:
            await asyncio.gather(*list(self._resolving.values()), return_exceptions=True)

    def describe(self, group_ids: Sequence[str]) -> list[DescribedGroup]:
        return [self._describe(group_id) for group_id in group_ids]

    def _describe(self, group_id: str) -> DescribedGroup:
        if not group_id:
            return DescribedGroup(group_id, Errors.INVALID_GROUP_ID)
        self._settle_batch(group_id)  # its members as their heartbeats leave them, not half-way
        shard = self.shard_for(group_id)
        status_error = _STATUS_ERRORS.get(shard.status)
        if status_error is not None:
            return DescribedGroup(group_id, status_error)
        group = shard.consumer_groups.get(group_id)
        if group is None:
            if group_id in shard.groups and not shard.groups[group_id].is_in(GroupState.DEAD):
                return DescribedGroup(group_id, Errors.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer "
                                      "group.")
            return DescribedGroup(group_id, Errors.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
        members = tuple(  # a member without a regular expression has "" in Kafka's describe, not null
            DescribedMember(m.member_id, m.instance_id, m.rack_id, m.member_epoch, m.client_id, m.client_host,
                            m.subscribed_topic_names, m.subscribed_topic_regex or "", self._described(m.assigned),
                            self._described(group.target_of(m.member_id)),
                            member_type=0 if m.uses_classic_protocol else 1)
            for m in group.members.values())
        return DescribedGroup(group_id, state=group.state.value, group_epoch=group.group_epoch,
                              assignment_epoch=group.assignment_epoch,
                              assignor_name=group.preferred_assignor() or self.settings.default_assignor,
                              members=members)

    def _described(self, partitions: Partitions) -> tuple[DescribedPartitions, ...]:
        """Topics the metadata no longer has are left out, as Kafka does."""
        out = []
        for topic_id, ps in partitions.items():
            image = self.topics.by_id(topic_id)
            if image is not None:
                out.append(DescribedPartitions(topic_id, image.name, ps))
        return tuple(out)

    # --- records ----------------------------------------------------------------------------------------------
    def _apply(self, shard: GroupShard, group_id: str, records: list[ConsumerGroupRecord],
               before: GroupUndo | None | object = _AS_NOW, *,
               written_first: Sequence[GroupMetadataRecord] = (),
               written_last: Sequence[GroupMetadataRecord] = (), fenced: Fenced | None = None,
               already_members: Collection[str] = (), carried_over: Collection[str] | None = None,
               replayed: bool = False, join_open: bool = False, repair: bool = False,
               kept: bool = False) -> Write | None:
        """Replays the records, tells the shard's observer what they change (observing.py: `fenced` and
        `already_members`, `carried_over` say what the records cannot) and returns them as the write for the shard's
        partition; if that write fails, the group goes back to `before` (None: no group; default: as it is now),
        unless a later write changed it meanwhile. `written_first`, `written_last`: the classic group's records a
        conversion writes around them. `replayed`: the records are on the group already (a batch's).
        `join_open`: if the group's latest write still waits for the end of its loop turn (`Write.sealed` not
        set), the records join it and it is returned again: one write, one outcome, and a failure takes the
        group back to before its first records (every member it touched). `repair`: the records are memory's
        value of keys a failed write may have left otherwise in the log (`_written`); they are written again
        whatever their own write's error, until one is acknowledged. `kept`: memory keeps the records whatever
        the write's outcome (the state before them is never to be served: `_fence_written_over`); a failure makes
        them a repair."""
        if not records:
            return None
        self._settle_batch(group_id)  # written after what the group's batch (if any) replayed already
        if before is _AS_NOW:
            current = shard.consumer_groups.get(group_id)
            before = current.undo_point() if current is not None else None
        previous = before if isinstance(before, GroupUndo) else None
        open_write = self._open.get(group_id) if join_open else None
        if open_write is not None and (open_write[0].done is None or open_write[0].sealed
                                       or self._unacknowledged.get(group_id, (None,))[0] is not open_write[0]):
            open_write = None  # not queued for the end of this turn (or sent already), or not the latest
        if not replayed:
            if previous is not None:
                previous.capture(records)
            if open_write is not None and open_write[1] is not None:
                open_write[1].capture(records)
            for record in records:
                self.replay(shard, record)
        try:
            self.watch.changed(shard.observer, group_id, previous, shard.consumer_groups.get(group_id), records,
                               fenced=fenced, already_members=already_members, carried_over=carried_over)
        except Exception:  # telling observers never breaks group logic
            log.exception("event=consumer_group_observer_failed group=%s", group_id)
        if open_write is not None:
            write, _, written = open_write
            write.records.extend(records)
            written.extend(records)
            return write
        # numbered over the service's life, never per group: a number a group had before could come back once its
        # entry goes (when its latest write is acknowledged) and make an older write's failure revert newer state
        self._last_sequence += 1
        sequence = self._write_sequence[group_id] = self._last_sequence
        owed = self._carry_repair(shard, group_id)
        written = [*owed, *records]
        repair = repair or kept or bool(owed)
        write = Write(group_id, [*written_first, *written, *written_last],
                      then=lambda error: self._written(shard, group_id, error, previous, sequence, written, repair,
                                                       revert=not kept))
        if owed:
            self._stand_in_for(group_id, write)
        self._unacknowledged[group_id] = (write, sequence)
        if written_first or written_last or already_members or carried_over is not None:
            self._open.pop(group_id, None)
        else:  # records of later heartbeats of this turn may join it (`join_open`)
            self._open[group_id] = (write, previous, written)
        return write

    def replaced_by_classic(self, shard: GroupShard, group: ConsumerGroup) -> None:
        """An Empty consumer group gave way to a classic group (join.py): its tombstones are written, as Kafka's
        maybeDeleteEmptyConsumerGroup writes them with the join, so a reload does not make it again beside the
        classic group. A write of it still unanswered is no longer the group's latest: if it fails, it must not
        bring the consumer group back beside the classic one (Kafka's revert would undo the replacement with it;
        here the classic group stands, computed on top), and its keys are written again as memory has them: gone
        (`_written`). The tombstones are not retried from here: a failed tombstone stays owed in the Kafka store,
        sent again with a backoff until a newer write of its key (storage/tombstones.py)."""
        self.deleted(group.group_id)
        if shard.status is ShardStatus.ACTIVE:
            tombstones: list[Record] = [*consumer_group_tombstones(group)]
            shard.append(Write(group.group_id, tombstones))

    def superseded_at_load(self, shard: GroupShard, group: ConsumerGroup) -> None:
        """A loaded consumer group whose group id has a classic record written after its records
        (runtime `_one_type_per_group`): it goes, its timers stopped and its tombstones written."""
        group_id = group.group_id
        for member_id in group.members:
            self.cancel_all(group_id, member_id)
        self.deleted(group_id)
        del shard.consumer_groups[group_id]
        shard.append(Write(group_id, [*consumer_group_tombstones(group)]))

    def repair_owed(self, group_id: str) -> bool:
        """Whether a repair write of the group waits for its resend (memory holds what the log may not; answers
        read from memory wait for it)."""
        return group_id in self._repairs

    def deleted(self, group_id: str) -> None:
        """The group is gone from memory with its tombstones written (DeleteGroups, admin.py; or a classic group
        took its place): a write of it still unanswered is no longer its latest. If it fails, the group does not
        come back (only the latest write reverts) and the keys it wrote are written again as memory has them:
        gone (`_written`); the log may hold them (a timeout)."""
        self._write_sequence.pop(group_id, None)
        self._open.pop(group_id, None)

    def classic_record_written(self, group_id: str) -> None:
        """A classic group that took a consumer group's place writes its record (its first generation's assignment,
        its Empty record, a static replacement): a write of the consumer group still unanswered (the downgrade's)
        is no longer the group's latest. The classic record is computed on top of it, and its clients are told
        what it says; if the downgrade's write then fails, it is not reverted (a reload keeps the classic record,
        written last: runtime `_one_type_per_group`), and the consumer group's keys are written again as memory
        has them, gone (`_written`). Kafka never reverts under a later write: a batch commits only after the ones
        before it (seed 1064 of --protocol upgrade: a downgrade's write, landed, timed out after the classic
        group's generation 8 was written and its members assigned; reverted, the consumer group came back with
        one member holding what generation 8 gave another, and a rejoining member was given a partition that
        member's client still owned)."""
        if group_id not in self.shard_for(group_id).consumer_groups:
            self.deleted(group_id)

    def unacknowledged(self, group_id: str) -> tuple[Write | None, int]:
        """The group's latest write Kafka has not acknowledged yet (None: every one was), and how many of the
        group's writes failed so far: an answer read from memory waits for the first and checks the second, as
        Kafka answers a request that writes nothing only once what was written before it is committed."""
        pending = self._unacknowledged.get(group_id)
        if pending is None and (owed := self._repairs.get(group_id)) is not None and owed.timer is not None:
            return owed.standing_in, self._failures.get(group_id, 0)  # a repair waiting for its resend
        return (None if pending is None else pending[0]), self._failures.get(group_id, 0)

    def _written(self, shard: GroupShard, group_id: str, error: Errors, before: GroupUndo | None,
                 sequence: int, records: Sequence[ConsumerGroupRecord] = (), repair: bool = False,
                 revert: bool = True) -> None:
        if error != Errors.NONE:  # the group's batch becomes its latest change before this one is looked at
            self._settle_batch(group_id)
        pending = self._unacknowledged.get(group_id)
        if pending is not None and pending[1] == sequence:
            del self._unacknowledged[group_id]
            self._open.pop(group_id, None)
        if error != Errors.NONE:
            self._failures[group_id] = self._failures.get(group_id, 0) + 1
        if error == Errors.NONE:
            if self._write_sequence.get(group_id) == sequence:
                del self._write_sequence[group_id]
            if repair:
                self._repaired(group_id)
            return
        active = shard.status is ShardStatus.ACTIVE
        latest = self._write_sequence.get(group_id) == sequence
        reverted = latest and active and revert
        if latest and active:
            del self._write_sequence[group_id]
        if reverted:
            self._restore(shard, group_id, before)
        log.warning("event=consumer_group_write_failed group=%s error=%s reverted=%s", group_id, error.name,
                    reverted)
        # NOT_COORDINATOR (the store's own refusal: the partition is not served here; or our producer fenced): the
        # partition is another instance's now and its unload follows; a rewrite would be refused the same way at
        # once, again and again
        # A repair (below) that failed, refused before the append included, is written again too: its revert
        # changes nothing in memory, and the log still holds what it was to overwrite (seed 652: a static classic
        # member's join landed under NOT_ENOUGH_REPLICAS_AFTER_APPEND, its tombstones were refused with
        # NOT_ENOUGH_REPLICAS, and a reload made the member beside its successor with the same instance id). Not
        # at once: a cluster that refuses fast would get one write per round trip; it waits (`_repair_later`).
        if active and error != Errors.NOT_COORDINATOR and repair:
            self._repair_later(shard, group_id, records)
        elif active and error != Errors.NOT_COORDINATOR and (not reverted or error not in _NOT_APPENDED):
            # Memory and the log may disagree on the keys this write wrote: not reverted (a later write was
            # computed on top of it and may be in the log already), or reverted while the write may have landed.
            # The log gets memory's value of each of them, or a reload would rebuild members from records that
            # assumed changes memory does not have.
            self._repair(shard, group_id, records)
        if active and not reverted and error in _NOT_APPENDED:
            self._undo_joins(shard, group_id, before, records, error)

    def _repair(self, shard: GroupShard, group_id: str, records: Sequence[ConsumerGroupRecord]) -> Write | None:
        """Memory's value of every key among `records` (tombstones of those it no longer has), written now."""
        group = shard.consumer_groups.get(group_id)
        rewrite = self._apply(shard, group_id, current_records(group or ConsumerGroup(group_id), records),
                              repair=True)
        if rewrite is not None:
            shard.append(rewrite)
        return rewrite

    def _repair_later(self, shard: GroupShard, group_id: str, records: Sequence[ConsumerGroupRecord]) -> None:
        """A repair write failed: its keys are written again once the backoff passes (with those of any other
        repair of the group owed meanwhile), the wait doubling with each resend that fails."""
        owed = self._repairs.get(group_id)
        if owed is None:
            owed = self._repairs[group_id] = _Repair(shard, [], self._standing_in(group_id))
        elif owed.timer is None:  # the resend failed too
            owed.delay_ms = next_retry_ms(owed.delay_ms)
            owed.standing_in = self._standing_in(group_id)
        owed.records.extend(records)
        if owed.timer is None:
            owed.timer = _MemberTimer(owed.delay_ms, lambda: self._repair_due(group_id))
            self.timer.add(owed.timer)
            log.warning("event=consumer_group_repair_owed group=%s retry_ms=%d", group_id, owed.delay_ms)

    @staticmethod
    def _standing_in(group_id: str) -> Write:
        return Write(group_id, [], done=asyncio.get_running_loop().create_future())

    def _repair_due(self, group_id: str) -> None:
        owed = self._repairs.get(group_id)
        if owed is None or owed.timer is None:
            return
        owed.timer = None
        shard = owed.shard
        if shard.status is not ShardStatus.ACTIVE:  # given up (its unload cancels the timer; this is a backstop)
            self._drop_repair(group_id, Errors.NOT_COORDINATOR)
            return
        # A group gone from memory since (deleted, downgraded, replaced) still gets it: memory's value is then a
        # tombstone of each key, and the write that ended it may have failed too (seed 86 of --protocol upgrade:
        # a downgrade's write timed out under a later upgrade's, and the member it fenced came back at a reload).
        records, owed.records = owed.records, []
        rewrite = self._repair(shard, group_id, records)
        if rewrite is None:
            self._drop_repair(group_id, Errors.NONE)
            return
        self._stand_in_for(group_id, rewrite)

    def _carry_repair(self, shard: GroupShard, group_id: str) -> list[ConsumerGroupRecord]:
        """A repair of the group waiting for its backoff goes out now with the group's next write, ahead of its
        records: memory's value of the repair's keys (as the write's own records leave them). Answers read from
        memory while it waited wait for its `standing_in`, which this write now resolves; had they waited for the
        timer's resend instead, that resend would be queued after this write and any later one, and an answer
        computed before them would reach its client after the answers to those later writes (seed 365 of
        --protocol consumer: a member's heartbeat, read from memory while a repair waited, was answered after its
        own leave was written and its partition given to another member). Kafka's runtime completes such an
        answer at the commit of the last offset written before it: writes and answers of a partition in one
        order. Empty when nothing waits for its backoff."""
        owed = self._repairs.get(group_id)
        if owed is None or owed.timer is None or owed.shard is not shard:
            return []
        owed.timer.cancel()
        owed.timer = None  # a resend is in flight: this write
        records, owed.records = owed.records, []
        return current_records(shard.consumer_groups.get(group_id) or ConsumerGroup(group_id), records)

    def _stand_in_for(self, group_id: str, write: Write) -> None:
        """The answers waiting for the group's owed repair get `write`'s outcome (it carries the repair: the
        timer's resend, or the group's next write)."""
        owed = self._repairs.get(group_id)
        if owed is None:
            return
        standing_in = owed.standing_in
        write.then_also(lambda error: _settle_stand_in(standing_in, error))

    def _drop_repair(self, group_id: str, error: Errors) -> None:
        """Nothing owed any more (`error` NONE), or not ours to write (NOT_COORDINATOR): answers waiting for the
        repair get that."""
        owed = self._repairs.pop(group_id, None)
        if owed is None:
            return
        if owed.timer is not None:
            owed.timer.cancel()
        _settle_stand_in(owed.standing_in, error)

    def _repaired(self, group_id: str) -> None:
        """A repair write was acknowledged: the group's next refused one starts the backoff again, unless one is
        owed still (its timer armed)."""
        owed = self._repairs.get(group_id)
        if owed is not None and owed.timer is None:
            self._drop_repair(group_id, Errors.NONE)

    def _cancel_repairs(self, shard: GroupShard) -> None:
        for group_id in [g for g, owed in self._repairs.items() if owed.shard is shard]:
            self._drop_repair(group_id, Errors.NOT_COORDINATOR)

    def _undo_joins(self, shard: GroupShard, group_id: str, before: GroupUndo | None,
                    records: Sequence[ConsumerGroupRecord], error: Errors) -> None:
        """A failed write that is not in the log (`_NOT_APPENDED`) and that a later one was computed on top of stays
        in memory (only the latest write reverts), but the dynamic consumer-protocol members it brought in, still
        as it left them, are fenced: their clients were
        told the join failed (Kafka reverts it: no such member remains), as the classic path restores a failed
        static replacement unless the member was replaced again meanwhile. One changed since (a later heartbeat
        of its own was written) is left as it is."""
        group = shard.consumer_groups.get(group_id)
        if group is None:
            return
        assignments = {r.member_id: r for r in records if isinstance(r, CurrentAssignmentRecord)}
        earlier = before.members if before is not None else {}
        for record in records:
            if (not isinstance(record, MemberMetadataRecord) or record.instance_id is not None
                    or record.classic is not None or record.member_id in earlier):
                continue
            member = group.members.get(record.member_id)
            if member is None or member.metadata_record(group_id) != record or (
                    record.member_id in assignments
                    and member.assignment_record(group_id) != assignments[record.member_id]):
                continue
            if validate_online_downgrade(group, member.member_id, self.config.group_consumer_migration_policy,
                                         self.config.group_max_size):
                continue  # its fence would convert the group: left to its session timeout
            log.warning("event=consumer_group_join_undone group=%s member=%s error=%s", group_id, member.member_id,
                        error.name)
            write = self._apply(shard, group_id, fence(group, member, self.topics, self), fenced=_JOIN_NOT_WRITTEN)
            if write is not None:
                shard.append(write)

    def load(self, shard: GroupShard, records: list[ConsumerGroupRecord]) -> int:
        """A loaded partition's consumer group records, in log order; returns the groups it now serves."""
        written_at: dict[tuple[str, str, RecordType], int] = {}  # (group, member, type) -> its latest record's index
        latest: dict[tuple[str, RecordType, str], ConsumerGroupRecord] = {}  # each key's last record in the log
        for index, record in enumerate(records):
            self.replay(shard, record)
            member_id = getattr(record, "member_id", None)
            if member_id is not None:
                written_at[(record.group_id, member_id, record.record_type)] = index
            latest[(record.group_id, record.record_type, member_id or getattr(record, "regex", None) or "")] = record
        self._tombstone_leftovers(shard, latest)
        for group in shard.consumer_groups.values():
            # from scratch: replayed one record at a time, a log with a lost write can give a partition to a member
            # that later left while its owner still holds it, and the leave drops the owner's entry (seed 184 of
            # --protocol upgrade: a joining member was given partitions their loaded owner had not revoked)
            group.index_partition_epochs()
        self.on_loaded(shard)
        for group in list(shard.consumer_groups.values()):
            self._raise_epoch_behind_members(shard, group)
            self._fence_written_over(shard, group, written_at)
        return len(shard.consumer_groups)

    def replay(self, shard: GroupShard, record: ConsumerGroupRecord) -> None:
        """One record onto its group: live changes and loading take this path. A value record creates the group;
        a tombstone of an unknown group is nothing to do; the group goes once its metadata is tombstoned."""
        group = shard.consumer_groups.get(record.group_id)
        if group is None:
            if isinstance(record, Tombstone):
                return
            group = shard.consumer_groups[record.group_id] = ConsumerGroup(record.group_id)
        group.replay(record)
        if group.deleted:
            del shard.consumer_groups[record.group_id]

    def on_loaded(self, shard: GroupShard) -> None:
        """After a load (GroupMetadataManager.onLoaded): every member's session timer, and the rebalance timer of
        those still revoking, start again (from now: a loaded member gets a whole session to come back)."""
        for group_id, group in shard.consumer_groups.items():
            log.info("Loaded consumer group %s with %d members.", group_id, len(group.members))
            try:
                self.watch.resumed(shard.observer, group)
            except Exception:  # telling observers never breaks a load
                log.exception("event=consumer_group_observer_failed group=%s", group_id)
            if not self.group_configs.known(group_id):  # armed with the defaults until it is read
                self._armed_unconfigured.add(group_id)
            for member_id, member in group.members.items():
                if member.classic is not None:
                    self.schedule_classic_session(group_id, member_id, member.classic.session_timeout_ms)
                    continue  # a classic member has join and sync timers instead, armed by its requests
                self.schedule_session(group_id, member_id)
                if member.state is MemberState.UNREVOKED_PARTITIONS:
                    self.schedule_rebalance(group_id, member_id, member.member_epoch, member.rebalance_timeout_ms)
        if self.checks is not None:
            self.checks.loaded(shard)

    def _tombstone_leftovers(self, shard: GroupShard,
                             latest: dict[tuple[str, RecordType, str], ConsumerGroupRecord]) -> None:
        """Records the log still holds that the loaded groups do not: a member's current assignment or target after
        its metadata's tombstone (memory drops the target of a member it does not have), a group made by such
        records alone (no group epoch record). Kafka writes a
        member's tombstones in one batch, its current assignment and target first, and its replay refuses a
        metadata tombstone before them; ours can land apart (the tombstone writer's owed tombstones sent at a
        shutdown while a write of the member's assignment was in flight: seed 2013 of --protocol upgrade). The
        load drops such a member (and a group left with nothing) from memory: their keys are tombstoned, so the
        log says what memory says, and no later load (a compaction having removed the metadata's tombstone) makes
        the member again."""
        alive: dict[str, list[ConsumerGroupRecord]] = {}
        for record in latest.values():
            if not isinstance(record, Tombstone):
                alive.setdefault(record.group_id, []).append(record)
        for group_id, records in alive.items():
            group = shard.consumer_groups.get(group_id)
            if group is not None and (group.members or (group_id, RecordType.GROUP_METADATA, "") in latest):
                records = [r for r in records if r.record_type in PER_MEMBER_TYPES]  # the group's own keys stand
                for member_id in [m for m in group.targets if m not in group.members]:  # a gone member's target
                    group.replay(Tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, group_id, member_id))
            elif group is not None:  # no group epoch record, no member: nothing Kafka would have made
                del shard.consumer_groups[group_id]
                self.deleted(group_id)
                group = None
            tombstones: list[Record] = [r for r in current_records(group or ConsumerGroup(group_id), records)
                                        if isinstance(r, Tombstone)]
            if tombstones:
                log.warning("event=consumer_group_leftovers_tombstoned group=%s records=%d", group_id,
                            len(tombstones))
                shard.append(Write(group_id, tombstones))

    def _raise_epoch_behind_members(self, shard: GroupShard, group: ConsumerGroup) -> None:
        """A loaded group whose epochs are out of Kafka's order (every member's epoch <= the target's epoch <= the
        group epoch: a member reaches an epoch only once the target of that epoch is written, after the group
        epoch's bump) lost the write that bumped them while a later write of a member landed: its current
        assignment at an epoch the log's group and target do not reach. Left so, the next target is computed at
        a lower epoch and the member reconciles back to it, told an epoch below one it was told (seed 2137 of
        --protocol mixed: a static join's group epoch 6 and its repairs timed out, a member's assignment at
        epoch 6 landed and was answered, the owed repair went with the partition; the load had group epoch 3).
        The group epoch is written past every epoch the log holds, so the next target comes at a new epoch,
        above any a member was told; kept whatever Kafka answers (a failure makes it a repair)."""
        members_top = max((member.member_epoch for member in group.members.values()), default=group.assignment_epoch)
        if members_top <= group.assignment_epoch <= group.group_epoch:
            return
        top = max(group.assignment_epoch, members_top)
        epoch = max(top, group.group_epoch) + 1
        log.warning("event=consumer_group_epoch_raised group=%s group_epoch=%d assignment_epoch=%d "
                    "member_epoch=%d epoch=%d", group.group_id, group.group_epoch, group.assignment_epoch, top, epoch)
        write = self._apply(shard, group.group_id, [GroupEpochRecord(group.group_id, epoch, group.metadata_hash)],
                            kept=True)
        if write is not None:
            shard.append(write)

    def _fence_written_over(self, shard: GroupShard, group: ConsumerGroup,
                            written_at: dict[tuple[str, str, RecordType], int]) -> None:
        """Members a loaded log holds beside later records that assumed them gone or changed are fenced as they are
        loaded: one of our writes can be lost while later ones land (a write that times out in the producer's queue
        is not appended, those queued after it are: librdkafka's idempotent producer leaves that gap), and a writer
        paused, stopped or crashed before the outcome repairs nothing (`_written`). In a log without such a gap,
        no two members hold one instance id (a write that gives it to a member removes its holder first), nor one
        partition in their targets (each target computation covers every member) or in their current assignments
        (a partition goes to a member once its owner's revocation is written). Where two do, the member whose
        records came first is the one the lost write removed or changed (replay gives an instance id to the later:
        `static_members`). Left in, its target overlaps the others' and the assignor fails (seed 513 of --protocol
        upgrade: two members of instance-3, 'Partitions were left unassigned', UNKNOWN_SERVER_ERROR; seed 184: a
        member whose fence was owed when its writer was paused, its target under a later one's)."""
        group_id = group.group_id
        stale = {member_id for member_id, member in group.members.items()
                 if member.instance_id is not None and group.static_members.get(member.instance_id) != member_id}
        targets = ((member_id, group.targets.get(member_id, {})) for member_id in group.members)
        currents = ((member_id, [member.assigned, member.pending_revocation])
                    for member_id, member in group.members.items())
        for record_type, held in ((RecordType.TARGET_ASSIGNMENT_MEMBER, ((m, [t]) for m, t in targets)),
                                  (RecordType.CURRENT_MEMBER_ASSIGNMENT, currents)):
            holders: dict[tuple[uuid.UUID, int], str] = {}
            for member_id, assignments in held:
                at = written_at.get((group_id, member_id, record_type), -1)
                for assignment in assignments:
                    for topic_id, partitions in assignment.items():
                        for partition in partitions:
                            other = holders.setdefault((topic_id, partition), member_id)
                            if other == member_id:
                                continue
                            if at > written_at.get((group_id, other, record_type), -1):
                                stale.add(other)
                                holders[(topic_id, partition)] = member_id
                            else:
                                stale.add(member_id)
        for member_id in [m for m in group.members if m in stale]:  # in the group's order: replays alike
            member = group.members[member_id]
            log.warning("event=consumer_group_member_written_over group=%s member=%s instance=%s", group_id,
                        member_id, member.instance_id)
            # kept if Kafka refuses it: reverted, the group would be back to two holders (a repair instead)
            write = self._apply(shard, group_id, fence(group, member, self.topics, self), fenced=_WRITTEN_OVER,
                                kept=True)
            if write is not None:
                shard.append(write)
        if stale:
            group.index_partition_epochs()  # a fenced member's release may have dropped another's entry

    def _group_config_changed(self, group_id: str, before: GroupConfig | None, after: GroupConfig) -> None:
        """A group's configuration read for the first time, or changed. Kafka arms a loaded member's session timer
        with its group's timeout: members loaded before it was read get it now. Any other change applies at each
        member's next heartbeat, as in Kafka."""
        if group_id == self._heartbeat_group:
            self._heartbeat_group = None
        if group_id not in self._armed_unconfigured:
            return
        self._armed_unconfigured.discard(group_id)
        group = self.shard_for(group_id).consumer_groups.get(group_id)
        if group is None or after.session_timeout_ms == self.group_configs.defaults.session_timeout_ms:
            return
        for member_id, member in group.members.items():
            running = self._timers.get(("session", group_id, member_id))
            if member.classic is None and running is not None and running.timeout_ms != after.session_timeout_ms:
                self.schedule_session(group_id, member_id)

    def _settings_of(self, group_id: str, now_ms: int) -> Settings:
        """The heartbeat settings with the group's heartbeat interval (one Settings per interval in use)."""
        config = self._heartbeat_config = self.group_configs.get(group_id, now_ms)
        self._heartbeat_group = group_id
        interval_ms = config.heartbeat_interval_ms
        settings = self._settings_by_interval.get(interval_ms)
        if settings is None:
            settings = self._settings_by_interval[interval_ms] = dataclasses.replace(
                self.settings, heartbeat_interval_ms=interval_ms)
        return settings

    # --- timers (heartbeat.MemberTimers) ----------------------------------------------------------------------
    def schedule_session(self, group_id: str, member_id: str) -> None:
        config = self._heartbeat_config if group_id == self._heartbeat_group else self.group_configs.get(group_id)
        key, timeout_ms = ("session", group_id, member_id), config.session_timeout_ms
        running = self._timers.get(key)
        if type(running) is SessionTimer and running.timeout_ms == timeout_ms and running.live:
            running.move(self.timer.clock.now_ms())  # the steady heartbeat: the same timer's deadline moved
            return
        self._cancel(key)
        task = self._timers[key] = SessionTimer(self.timer, timeout_ms, lambda: self._fence_expired(
            group_id, member_id, None, _SESSION_EXPIRED))
        self.timer.add(task)

    def schedule_rebalance(self, group_id: str, member_id: str, member_epoch: int, timeout_ms: int) -> None:
        self._schedule(("rebalance", group_id, member_id), timeout_ms,
                       lambda: self._fence_expired(group_id, member_id, member_epoch, Fenced(
                           f"it failed to transition from epoch {member_epoch} within {timeout_ms}ms.",
                           RebalanceCategory.REBALANCE_TIMEOUT)))

    def cancel_rebalance(self, group_id: str, member_id: str) -> None:
        self._cancel(("rebalance", group_id, member_id))

    def schedule_classic_session(self, group_id: str, member_id: str, timeout_ms: int) -> None:
        self._schedule(("session", group_id, member_id), timeout_ms,
                       lambda: self._fence_expired(group_id, member_id, None, _SESSION_EXPIRED))

    def schedule_join_timeout_if_absent(self, group_id: str, member_id: str, timeout_ms: int) -> None:
        if ("join", group_id, member_id) not in self._timers:
            self._schedule(("join", group_id, member_id), timeout_ms, lambda: self._fence_expired(
                group_id, member_id, None, Fenced("the classic member failed to join within the rebalance timeout.",
                                                  RebalanceCategory.REBALANCE_TIMEOUT), kind="join"))

    def cancel_join_timeout(self, group_id: str, member_id: str) -> None:
        self._cancel(("join", group_id, member_id))

    def schedule_sync_timeout(self, group_id: str, member_id: str, timeout_ms: int) -> None:
        self._schedule(("sync", group_id, member_id), timeout_ms, lambda: self._fence_expired(
            group_id, member_id, None, Fenced("the member failed to sync within timeout.",
                                              RebalanceCategory.SYNC_TIMEOUT), kind="sync"))

    def cancel_sync_timeout(self, group_id: str, member_id: str) -> None:
        self._cancel(("sync", group_id, member_id))

    def cancel_all(self, group_id: str, member_id: str) -> None:
        for kind in ("session", "rebalance", "join", "sync"):
            self._cancel((kind, group_id, member_id))

    def _schedule(self, key: tuple[str, str, str], delay_ms: int, callback: Callable[[], None]) -> None:
        self._cancel(key)
        task = self._timers[key] = _MemberTimer(delay_ms, callback)
        self.timer.add(task)

    def _cancel(self, key: tuple[str, str, str]) -> None:
        task = self._timers.pop(key, None)
        if task is not None:
            task.cancel()

    def _fence_expired(self, group_id: str, member_id: str, at_epoch: int | None, reason: Fenced,
                       kind: str | None = None) -> None:
        """A timer ran out: the member is fenced (a rebalance timeout only if the member is still at the epoch it
        had to move on from)."""
        if self.checks is not None:
            self.checks.fencing(group_id, member_id, at_epoch, reason, kind)
        kind = kind or ("session" if at_epoch is None else "rebalance")
        self._timers.pop((kind, group_id, member_id), None)
        self._settle_batch(group_id)
        shard = self.shard_for(group_id)
        group = shard.consumer_groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None or shard.status is not ShardStatus.ACTIVE:
            return
        if at_epoch is not None and member.member_epoch != at_epoch:
            return
        log.info("[GroupId %s] %s", group_id, reason.line(member_id))
        if validate_online_downgrade(group, member_id, self.config.group_consumer_migration_policy,
                                     self.config.group_max_size):
            shard.append(self._downgrade(shard, group, member_id, self._left(group, member_id, reason),
                                         fenced=reason))
            return
        write = self._apply(shard, group_id, fence(group, member, self.topics, self), fenced=reason)
        if write is not None:
            shard.append(write)

    def unload_stepwise(self, shard: GroupShard) -> Iterator[int]:
        """The shard's groups leave this instance: their timers go with them, and the repairs they owe (the
        partition's next owner loads what the log has). A group at a time, for a caller that yields to the loop
        between slices (the runtime, the shard given up first: nothing of a group not reached yet acts meanwhile):
        after each group, how many groups and members it took."""
        self._cancel_repairs(shard)
        for group_id in [g for g, batch in self._batches.items() if batch.shard is shard]:
            self._answer(self._batches.pop(group_id).waiting, (), Errors.NOT_COORDINATOR)  # nothing of it written
        groups = shard.consumer_groups
        while groups:
            waiting = list(groups.items())  # taken off as they go: each group freed in its own slice
            waiting.reverse()
            while waiting:
                group_id, group = waiting.pop()
                if groups.get(group_id) is not group:
                    continue
                self._armed_unconfigured.discard(group_id)
                for member_id in group.members:
                    self.cancel_all(group_id, member_id)
                resolving = self._resolving.pop(group_id, None)
                if resolving is not None:
                    resolving.cancel()
                self.watch.gone(shard.observer, group_id, "the group was unloaded")
                del groups[group_id]
                yield 1 + len(group.members)


def current_records(group: ConsumerGroup, written: Sequence[ConsumerGroupRecord]) -> list[ConsumerGroupRecord]:
    """The group's current value of every key among `written` (a record, or a tombstone of a key it no longer
    has), in the order replay needs: members' metadata, the group epoch, targets, the target epoch, current
    assignments, regular expressions, then tombstones (current assignment, target, metadata of each member)."""
    group_id = group.group_id
    member_keys: dict[str, set[RecordType]] = {}
    group_types: set[RecordType] = set()
    regexes: list[str] = []
    for record in written:
        member_id = getattr(record, "member_id", None)
        if record.record_type in PER_MEMBER_TYPES and member_id is not None:
            member_keys.setdefault(member_id, set()).add(record.record_type)
        elif record.record_type is RecordType.REGULAR_EXPRESSION:
            regex = getattr(record, "regex", None)
            if regex is not None and regex not in regexes:
                regexes.append(regex)
        else:
            group_types.add(record.record_type)
    metadata: list[ConsumerGroupRecord] = []
    targets: list[ConsumerGroupRecord] = []
    current: list[ConsumerGroupRecord] = []
    tombstones: list[ConsumerGroupRecord] = []
    for member_id, types in member_keys.items():
        member = group.members.get(member_id)
        if RecordType.MEMBER_METADATA in types and member is not None:
            metadata.append(member.metadata_record(group_id))
        if RecordType.TARGET_ASSIGNMENT_MEMBER in types and member_id in group.targets:
            targets.append(TargetAssignmentRecord(group_id, member_id, group.targets[member_id]))
        if RecordType.CURRENT_MEMBER_ASSIGNMENT in types and member is not None:
            current.append(member.assignment_record(group_id))
        for record_type in (RecordType.CURRENT_MEMBER_ASSIGNMENT, RecordType.TARGET_ASSIGNMENT_MEMBER,
                            RecordType.MEMBER_METADATA):
            gone = member is None if record_type is not RecordType.TARGET_ASSIGNMENT_MEMBER \
                else member_id not in group.targets
            if record_type in types and gone:
                tombstones.append(Tombstone(record_type, group_id, member_id))
    out: list[ConsumerGroupRecord] = list(metadata)
    gone_group = group.group_epoch == 0 and not group.members  # not in memory (any more)
    if RecordType.GROUP_METADATA in group_types and not gone_group:
        out.append(GroupEpochRecord(group_id, group.group_epoch, group.metadata_hash))
    out.extend(targets)
    if RecordType.TARGET_ASSIGNMENT_METADATA in group_types and not gone_group:
        out.append(TargetAssignmentEpochRecord(group_id, group.assignment_epoch))
    out.extend(current)
    for regex in regexes:
        resolved = group.resolved_regexes.get(regex)
        out.append(resolved if resolved is not None else Tombstone(RecordType.REGULAR_EXPRESSION, group_id,
                                                                    regex=regex))
    if gone_group:  # Kafka's order: the target epoch, then the group epoch (whose tombstone ends the group)
        tombstones += [Tombstone(t, group_id) for t in (RecordType.TARGET_ASSIGNMENT_METADATA,
                                                        RecordType.GROUP_METADATA) if t in group_types]
    return out + tombstones
