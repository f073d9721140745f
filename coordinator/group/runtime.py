"""GroupRuntime: routes every group request to the shard of the group's state-topic partition, appends what the
handler returns to that partition and answers once Kafka has acknowledged it (Kafka 4's CoordinatorRuntime).

    request ─► shard_for(group id) ─► handler(shard, request) ─► Result(writes, response)
                                                   │ append each write to the shard's partition (in order)
                                                   ▼ then(error) on the loop, then the response (or the
                                                     parked future, answered later by group logic)

One shard per partition (`offsets.topic.num.partitions`), each with its own status: UNOWNED (NOT_COORDINATOR),
LOADING (COORDINATOR_LOAD_IN_PROGRESS), ACTIVE, STOPPED (COORDINATOR_NOT_AVAILABLE). `load(partitions)` reads
partitions through the store and materialises their groups partition by partition, yielding to the loop
between slices, so the shards already served keep answering; `unload(partitions)` answers the parked requests
of their groups NOT_COORDINATOR and stops the store writing to them (a slice of groups per loop turn, as
`shutdown` unloads). Several instances (cluster/ownership.py) call these two as partitions move between them, and
`give_up(partitions)` where a partition must stop being served at once, in the callback that learns it (lost,
fenced): its groups then go a slice per loop turn in a task, which `unload` and `load` of the partition wait for.

A write that group logic makes on its own (an emptied group's record, from a timer) goes through the same
append (`shard.append`), queued at once: a partition's writes reach the store in the order the shard made them.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Collection, Coroutine, Iterator, Mapping, ValuesView
from typing import Any, Callable, TypeVar, cast

from coordinator.config import CoordinatorConfig
from coordinator.group import admin, heartbeat, join, leave, offsets, sync
from coordinator.group.api import (DeletableGroupResult, DeleteGroupsRequest, DeleteGroupsResponse,
                                   DescribeGroupsRequest, DescribeGroupsResponse, HeartbeatRequest,
                                   HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
                                   LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
                                   OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
                                   OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse)
from coordinator.group.member import answer_parked
from coordinator.group.metadata import GroupMetadata
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.heartbeat import HeartbeatRequest as HeartbeatRequestV2
from coordinator.group.modern.heartbeat import HeartbeatResponse as HeartbeatResponseV2
from coordinator.group.modern.service import ConsumerGroupService
from coordinator.group.modern.service import DescribedGroup as DescribedConsumerGroup
from coordinator.group.modern.steady import SteadyMember
from coordinator.group.observer import GroupObserver
from coordinator.group.partitioner import cached_partition_for, partition_cache
from coordinator.group.records import GroupMetadataRecord
from coordinator.group.result import Result, Write
from coordinator.group.shard import GroupShard
from coordinator.group.status import ShardStatus
from coordinator.group.store import GroupStore, LoadedGroups, StoreError
from coordinator.group.txn_offsets import TransactionEvent, follow_own_tombstones, replay_transaction_events
from coordinator.group.delayed import DelayedHeartbeat
from coordinator.group.errors import kafka4_append_error
from coordinator.purgatory import DelayedOperation, DelayedOperationPurgatory
from coordinator.timer import Clock, MonotonicClock, SystemTimer, WallClock
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.group")

_LOAD_SLICE = 2_000  # groups materialised between two yields to the event loop
# Groups and their members unloaded between two yields to the loop. A member costs ~2 µs (classic) and ~4.5 µs
# (consumer protocol) in process (bench/shutdown_unload.py), a classic one ~5 µs in `coordinator serve` with its
# telemetry (docs/performance.md, "Shutdown's unload a slice per loop turn"): a slice is ~1-2.5 ms of the loop, a
# few ms in the service. A group is never split: one of more members than this is a slice of its own.
UNLOAD_SLICE = 500
_NAMES_LOGGED = 10  # of a list of topics in one log line
Q = TypeVar("Q")  # a request
R = TypeVar("R")  # its response
# A request's handler: its Result (writes, response or future), or, writing nothing, its response or future alone.
_Handler = Callable[[GroupShard, Q], "Result[R] | asyncio.Future[R] | R"]
_Append = tuple[int, list[Write], Awaitable[None], bool]  # partition, writes, the store's outcome, by_request
# What telemetry puts around a request that is not part of a rebalance: (its API's name, the request, how it is
# served) -> the answer (coordinator/telemetry/requests.py)
RequestSpans = Callable[[str, Any, Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


class GroupRuntime:
    def __init__(self, config: CoordinatorConfig, timer: SystemTimer, store: GroupStore,
                 clock: Clock | None = None, observer: GroupObserver | None = None,
                 wall_clock: Clock | None = None) -> None:
        self.config = config
        self.timer = timer
        self.store = store
        self.clock: Clock = clock if clock is not None else timer.clock
        # Stored timestamps are epoch ms, like Kafka's; deadlines use the monotonic clock. A test's manual clock
        # serves as both, so one timeline drives everything.
        if wall_clock is None:
            wall_clock = WallClock() if isinstance(self.clock, MonotonicClock) else self.clock
        self.wall_clock: Clock = wall_clock
        self._observer: GroupObserver = observer if observer is not None else GroupObserver()
        purge = config.purgatory_purge_interval
        # Shared by the shards: their keys carry the group id, so each shard's keys are its own.
        self.heartbeat_purgatory: DelayedOperationPurgatory[DelayedHeartbeat] = DelayedOperationPurgatory(
            "Heartbeat", timer, purge, owns_timer=False)
        self.rebalance_purgatory: DelayedOperationPurgatory[DelayedOperation] = DelayedOperationPurgatory(
            "Rebalance", timer, purge, owns_timer=False)
        self.num_partitions = config.offsets_topic_num_partitions
        if store.partitions is not None and store.partitions != self.num_partitions:
            raise ValueError(f"the store's state topic has {store.partitions} partitions, the runtime routes groups "
                             f"over offsets.topic.num.partitions={self.num_partitions}")
        self._partition_cache = partition_cache(self.num_partitions)
        # group id -> partition for the ids clients keep asking about (the cache's own dict, emptied in place):
        # a heartbeat finds its shard with one lookup here, no call
        self._kept_partitions = self._partition_cache.kept
        self.shards = [GroupShard(p, config, self.clock, self.wall_clock, self._observer, self.heartbeat_purgatory,
                                  self.rebalance_purgatory, self._appender(p),
                                  functools.partial(self.append_in_turn, p))
                       for p in range(self.num_partitions)]
        for shard in self.shards:  # one instance owns every partition until told otherwise (step 2)
            shard.status = ShardStatus.ACTIVE
            shard.expect_write = functools.partial(store.expect_append, shard.partition)
            shard.unwritten_tombstones = store.unwritten_tombstones_of
            shard.unwritten_group_tombstones = store.unwritten_group_tombstones_of
        self.groups: Mapping[str, GroupMetadata] = _GroupsView(self.shards)
        self.consumer_groups = ConsumerGroupService(config, timer, self.shard_for, wall_clock=self.wall_clock)
        self.consumer_groups.batch_targets = True
        for shard in self.shards:
            shard.consumer_group_replaced = self.consumer_groups.replaced_by_classic
            shard.consumer_group_deleted = self.consumer_groups.deleted
        # how subscribed topics are learnt before a ConsumerGroupHeartbeat (the relay's cluster view); None: the
        # topics ConsumerGroupService.topics has are all there is
        self.refresh_topics: Callable[[list[str]], Awaitable[object]] | None = None
        # which of those topics are due for a refresh (older than the heartbeat interval); None: every heartbeat
        # awaits `refresh_topics`
        self.stale_topics: Callable[[Collection[str]], list[str]] | None = None
        self._refreshing_topics: dict[str, asyncio.Task[None]] = {}  # refreshes in the background, by topic
        # what telemetry puts around LeaveGroup, OffsetCommit, DescribeGroups and DeleteGroups (a span each,
        # coordinator/telemetry/requests.py); None: served as they are
        self.request_spans: RequestSpans | None = None
        self.is_active = True
        # insertion-ordered (a dict, not a set): shutdown cancels the writes in the order they were made, not in
        # the tasks' memory-address order, so their answers go out in a reproducible order
        # the runtime's tasks, cancelled at shutdown; a write's task with its append (settled by shutdown if the
        # task never started: `_settle_if_never_started`)
        # (or, for an append whose outcome settles its listeners itself, that outcome: `_await_appended`)
        self._tasks: dict[asyncio.Future[Any], _Append | None] = {}
        # partition -> its writes waiting for the end of this loop turn, to go to the store as one (append_in_turn)
        self._in_turn: dict[int, list[Write]] = {}
        self._appending: dict[int, int] = {}  # partition -> its store appends not answered yet
        # partition -> the outcomes of its appends that came while its groups are unloaded, settled after them
        # (writes, outcome, by_request, elapsed ms)
        self._held: dict[int, list[tuple[list[Write], Errors, bool, float]]] = {}
        # partition -> the unload of its groups under way (`give_up`'s task, or a future standing for `unload`'s or
        # `shutdown`'s own): another unload or a load of the partition waits for it; `give_up` leaves it the work
        self._unloading: dict[int, asyncio.Future[Any]] = {}
        # False: every write goes to the store at once, each its own append (A/B benches; see append_in_turn)
        self.write_turns = True
        # groups materialised by a load, and groups and members unloaded, between two yields to the loop (a test
        # sets smaller slices to see them)
        self.load_slice = _LOAD_SLICE
        self.unload_slice = UNLOAD_SLICE

    @property
    def observer(self) -> GroupObserver:
        return self._observer

    @observer.setter
    def observer(self, observer: GroupObserver) -> None:
        """Replace the observer of every shard; only before any group exists (a group keeps the observer it was
        created with)."""
        self._observer = observer
        for shard in self.shards:
            shard.observer = observer

    # --- routing ----------------------------------------------------------------------------------------------
    def partition_for(self, group_id: str) -> int:
        return self._partition_cache.partition(group_id)

    def state_partition(self, group_id: str) -> tuple[str, int] | None:
        """The state-topic partition holding `group_id` (None: a store without a topic)."""
        topic = self.store.topic
        return None if topic is None else (topic, self.partition_for(group_id))

    def shard_for(self, group_id: str | None) -> GroupShard:
        """The shard of `group_id`'s partition ("" hashes to 0 as in Kafka; None goes there too and is rejected)."""
        if group_id is None:
            return self.shards[0]
        partition = self._kept_partitions.get(group_id)
        return self.shards[self._partition_cache.partition(group_id) if partition is None else partition]

    @property
    def heartbeat_count(self) -> int:
        """Heartbeats answered, over every shard (metrics read it)."""
        return sum(shard.heartbeat_count for shard in self.shards)

    @property
    def is_loading(self) -> bool:
        return any(shard.status is ShardStatus.LOADING for shard in self.shards)

    # --- requests ---------------------------------------------------------------------------------------------
    def _mixed_group(self, group_id: str) -> ConsumerGroup | None:
        """The consumer group a classic request goes to: one with members (an empty one gives way to a classic
        group, join.py) on a shard that serves it."""
        shard = self.shard_for(group_id)
        group = shard.consumer_groups.get(group_id)
        if group is None or not group.members or shard.status is not ShardStatus.ACTIVE:
            return None
        return group

    async def join_group(self, req: JoinGroupRequest) -> JoinGroupResponse:
        consumer_group = self._mixed_group(req.group_id)
        if consumer_group is None:
            return await self._serve(req.group_id, join.handle_join_group, req)
        if not (self.config.group_min_session_timeout_ms <= req.session_timeout_ms
                <= self.config.group_max_session_timeout_ms):  # checked first for every group, as Kafka does
            return JoinGroupResponse(Errors.INVALID_SESSION_TIMEOUT, member_id=req.member_id)
        response, write, then = self.consumer_groups.classic_join(consumer_group, req)
        if write is not None:
            [error] = await self._written(self._start(self.shard_for(req.group_id), [write]))
        else:  # what it says (the member's epoch) may come from a write not acknowledged yet
            error = await self._earlier_writes(req.group_id) if response.error_code == Errors.NONE else Errors.NONE
        if error != Errors.NONE:
            return JoinGroupResponse(kafka4_append_error(error), member_id=req.member_id)
        if then is not None:
            then()
        return response

    async def sync_group(self, req: SyncGroupRequest) -> SyncGroupResponse:
        consumer_group = self._mixed_group(req.group_id)
        if consumer_group is not None:
            response = self.consumer_groups.classic_sync(consumer_group, req)
            error = await self._earlier_writes(req.group_id) if response.error_code == Errors.NONE else Errors.NONE
            return response if error == Errors.NONE else SyncGroupResponse(kafka4_append_error(error))
        return await self._serve(req.group_id, sync.handle_sync_group, req)

    async def _earlier_writes(self, group_id: str) -> Errors:
        """A classic member's answer read from a consumer group's memory (its epoch, its assignment) goes out once
        the group's earlier writes are acknowledged, as Kafka's runtime completes a write operation that wrote
        nothing at the last written offset's commit; if one of them failed meanwhile, what memory said may never
        reach the log (a reload would tell the member an older epoch): the error, and the client retries."""
        earlier = self._earlier_write(group_id)
        if earlier is None:
            return Errors.NONE
        outcome: asyncio.Future[Errors] = asyncio.get_running_loop().create_future()

        def settled(error: Errors) -> None:
            if not outcome.done():
                outcome.set_result(error)

        self._after_earlier_writes(group_id, *earlier, settled)
        await asyncio.wait([outcome])  # (never cancelled: this coroutine's own, set once)
        return outcome.result()

    def _earlier_write(self, group_id: str) -> tuple[Write, int] | None:
        """The group's latest write not settled yet (or the stand-in of the repair it owes) and how many of its
        writes failed so far: what an answer read from memory waits for; None: nothing to wait for."""
        pending, failures = self.consumer_groups.unacknowledged(group_id)
        return None if pending is None or pending.done is None else (pending, failures)

    def _after_earlier_writes(self, group_id: str, pending: Write, failures: int,
                              then: Callable[[Errors], object]) -> None:
        """`then(error)` once `pending` (`_earlier_write`) is settled, in that write's own settling, after the
        answers registered before: an answer read from memory goes out in the order of the writes, before the
        answers of later writes settled in the same loop turn (seed 4100 of --protocol upgrade: a join retried
        after a lost connection, read from memory at epoch 5, went out after the answer of the member's next
        heartbeat, written later at epoch 6, when an outage's end acknowledged both at once). `error`: NONE when
        that write and every earlier one were acknowledged; else the write's error, or NOT_ENOUGH_REPLICAS for an
        earlier write that failed meanwhile (more than `failures`)."""
        service = self.consumer_groups

        def settled(error: Errors) -> None:
            if error == Errors.NONE and service.unacknowledged(group_id)[1] != failures:
                error = Errors.NOT_ENOUGH_REPLICAS
            then(error)

        pending.then_also(settled)

    # JoinGroup and SyncGroup without a coroutine (the connection's fast path; a rebalance serves two per member):
    # the answer, the future group logic answers, or, when something must be awaited first, join_group's or
    # sync_group's coroutine (decided before any group logic runs).
    def start_join_group(self, req: JoinGroupRequest) -> JoinGroupResponse | Awaitable[JoinGroupResponse]:
        shard = self.shard_for(req.group_id)
        if shard.consumer_groups and self._mixed_group(req.group_id) is not None:
            return self.join_group(req)
        return self._begin_on(shard, join.handle_join_group, req)

    def start_sync_group(self, req: SyncGroupRequest) -> SyncGroupResponse | Awaitable[SyncGroupResponse]:
        shard = self.shard_for(req.group_id)
        if shard.consumer_groups and self._mixed_group(req.group_id) is not None:
            return self.sync_group(req)
        return self._begin_on(shard, sync.handle_sync_group, req)

    def handle_heartbeat(self, group_id: str, generation_id: int, member_id: str,
                         group_instance_id: str | None = None) -> Errors:
        """The hot path, synchronous: no writes, no futures."""
        partition = self._kept_partitions.get(group_id)  # shard_for's lookup, inline: a call less per heartbeat
        shard = self.shard_for(group_id) if partition is None else self.shards[partition]
        if shard.consumer_groups and group_id in shard.consumer_groups:
            consumer_group = self._mixed_group(group_id)
            if consumer_group is not None:
                return self.consumer_groups.classic_heartbeat(consumer_group, member_id, generation_id,
                                                              group_instance_id)
        return heartbeat.handle_heartbeat(shard, group_id, generation_id, member_id, group_instance_id)

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        return HeartbeatResponse(
            self.handle_heartbeat(req.group_id, req.generation_id, req.member_id, req.group_instance_id))

    def start_consumer_group_heartbeat(self, req: HeartbeatRequestV2
                                       ) -> HeartbeatResponseV2 | Awaitable[HeartbeatResponseV2]:
        """`consumer_group_heartbeat` without a coroutine when there is nothing to wait for (the steady state):
        the answer, or what to await for it. A subscribed topic the cluster view does not know yet is learnt
        first; one it knows but has not refreshed within the heartbeat interval is refreshed in the background,
        its news reaching the group at a later heartbeat, as Kafka's coordinator serves a heartbeat with the
        metadata image it has while a newer one is on its way. A group whose configuration (its session timeout and
        heartbeat interval) has not been read from the cluster yet is read first."""
        if self._group_config_unread(req):
            return self._configured_then_answered(req)
        return self._start_heartbeat(req)

    def _group_config_unread(self, req: HeartbeatRequestV2) -> bool:
        """A join, or a heartbeat of a group here, whose group's configuration has not been read yet (a leave needs
        none, and a heartbeat of a group not here is refused whatever it is)."""
        return (req.member_epoch >= 0 and not self.consumer_groups.group_configs.known(req.group_id)
                and (req.member_epoch == 0 or req.group_id in self.shard_for(req.group_id).consumer_groups))

    async def _configured_then_answered(self, req: HeartbeatRequestV2) -> HeartbeatResponseV2:
        await self.consumer_groups.group_configs.first_read(req.group_id)
        answer = self._start_heartbeat(req)
        return answer if isinstance(answer, HeartbeatResponseV2) else await answer

    def _start_heartbeat(self, req: HeartbeatRequestV2) -> HeartbeatResponseV2 | Awaitable[HeartbeatResponseV2]:
        names = self._names_to_look_at(req)
        if not self._known_or_refreshing(names):
            return self._refreshed_then_answered(req, names)
        return self._answer_heartbeat(req)

    def _known_or_refreshing(self, names: Collection[str]) -> bool:
        """False: a topic the cluster view does not know yet (the heartbeat waits for it to be learnt); True: every
        one is known, and those not refreshed within the heartbeat interval are refreshed in the background."""
        if not names or self.refresh_topics is None:
            return True
        known = self.consumer_groups.topics.by_name
        if self.stale_topics is None or any(known(name) is None for name in names):
            return False
        self._refresh_in_background(names, self.stale_topics)
        return True

    def steady_consumer_group_heartbeat(self, req: HeartbeatRequestV2) -> HeartbeatResponseV2 | None:
        """`start_consumer_group_heartbeat` of a heartbeat whose every field after the epoch is null, when the group
        logic's steady shortcut answers it and nothing is to be waited for: the group's configuration read, no
        write of the group unacknowledged, no subscribed topic unknown to the cluster view when the group looks at
        their metadata again (known ones are refreshed in the background, as there). None:
        `start_consumer_group_heartbeat` serves it; a background refresh started here is not started twice."""
        group = self.shard_for(req.group_id).consumer_groups.get(req.group_id)
        service = self.consumer_groups
        if group is None or not service.group_configs.known(req.group_id):
            return None
        if self._earlier_write(req.group_id) is not None:
            return None
        if (service.timer.clock.now_ms() >= group.metadata_refresh_deadline_ms
                and not self._known_or_refreshing(group.topic_names())):
            return None
        return service.steady_heartbeat(req)

    def steady_member(self, group_id: str, member_id: str) -> SteadyMember | None:
        """After `steady_consumer_group_heartbeat` answered the member: what that answer came from, to answer its
        next steady heartbeats with `steady_again` (modern/steady.py); None: nothing to keep."""
        return self.consumer_groups.steady_member(group_id, member_id, self._known_or_refreshing)

    def steady_again(self, steady: SteadyMember) -> bool:
        """The member's steady heartbeat answered as `steady` was (its session deadline moved), if nothing it came
        from changed; False: nothing was done, `steady_consumer_group_heartbeat` or the general path serves it."""
        return steady.service is self.consumer_groups and steady.renew()

    async def consumer_group_heartbeat(self, req: HeartbeatRequestV2) -> HeartbeatResponseV2:
        """ConsumerGroupHeartbeat (KIP-848): the subscribed topics are learnt first (a topic or partition the
        cluster gained shows up in the target), then the group logic answers synchronously."""
        if self._group_config_unread(req):
            await self.consumer_groups.group_configs.first_read(req.group_id)
        return await self._refreshed_then_answered(req, self._subscribed_names(req))

    async def _refreshed_then_answered(self, req: HeartbeatRequestV2, names: Collection[str]
                                       ) -> HeartbeatResponseV2:
        if names:
            await self._refresh_topics_logged(list(names), req.group_id)
        answer = self._answer_heartbeat(req)
        return answer if isinstance(answer, HeartbeatResponseV2) else await answer

    def _subscribed_names(self, req: HeartbeatRequestV2) -> Collection[str]:
        """The topics the request subscribes to, or its group's (by name or through a regular expression) for a
        heartbeat that does not repeat them."""
        if req.subscribed_topic_names is not None:
            return req.subscribed_topic_names
        group = self.shard_for(req.group_id).consumer_groups.get(req.group_id)
        return group.topic_names() if group is not None else ()

    def _names_to_look_at(self, req: HeartbeatRequestV2) -> Collection[str]:
        """The topics a request subscribes to; for a heartbeat that does not repeat them, every topic its group
        subscribes to once the group looks at their metadata again (heartbeat.subscribe, once per heartbeat
        interval, at whichever member's heartbeat comes first), else none."""
        if req.subscribed_topic_names is not None:
            return req.subscribed_topic_names
        group = self.shard_for(req.group_id).consumer_groups.get(req.group_id)
        if group is None or self.consumer_groups.timer.clock.now_ms() < group.metadata_refresh_deadline_ms:
            return ()
        return group.topic_names()

    def _refresh_in_background(self, names: Collection[str], stale_topics: Callable[[Collection[str]], list[str]]
                               ) -> None:
        """One refresh at a time per topic, for the topics not refreshed within the heartbeat interval."""
        stale = [name for name in stale_topics(names) if name not in self._refreshing_topics]
        if not stale:
            return
        assert self.refresh_topics is not None
        task = asyncio.get_running_loop().create_task(self._refresh_topics_logged(stale))
        for name in stale:
            self._refreshing_topics[name] = task
        self._tasks[task] = None  # cancelled at shutdown, as writes are
        task.add_done_callback(self._forget_task)
        task.add_done_callback(lambda _done: [self._refreshing_topics.pop(name, None) for name in stale])

    async def _refresh_topics_logged(self, names: list[str], group_id: str | None = None) -> None:
        """The topics learnt from the cluster; if it is unreachable, a log line, and the group is served with what
        is known meanwhile. `group_id`: the group whose heartbeat waits for this refresh; none for a background
        refresh, which serves every group subscribed to these topics."""
        if self.refresh_topics is None:
            return
        try:
            await self.refresh_topics(names)
        except Exception as exc:
            waiting = f"group={group_id}" if group_id is not None else "background=true"
            log.warning("event=topic_refresh_failed %s topics=%d names=%s error=%r", waiting, len(names),
                        _some_names(names), exc)

    def _answer_heartbeat(self, req: HeartbeatRequestV2) -> HeartbeatResponseV2 | Awaitable[HeartbeatResponseV2]:
        """The group logic's answer, at once when it wrote nothing and the group has no write in flight; else
        once the writes are acknowledged."""
        response, write = self.consumer_groups.heartbeat(req)
        if isinstance(response, asyncio.Future):  # answered with its batch's shared target (service._batched)
            return response
        if write is None:
            earlier = self._earlier_write(req.group_id)
            if earlier is None:
                return response
            answer, answered = _heartbeat_answer(response)
            self._after_earlier_writes(req.group_id, *earlier, answered)
            return answer
        return self._after_write(write, response)

    def _after_write(self, write: Write, response: HeartbeatResponseV2) -> asyncio.Future[HeartbeatResponseV2]:
        """The write queued (`append_in_turn`: at once with nothing of its partition in flight, else at the end of
        this loop turn with the partition's other writes of the turn, one transaction for all the members revoking
        or acknowledging meanwhile); the answer
        resolved in the write's own callback, right after the group logic's, once Kafka acknowledged or refused
        it: no loop turn between the write's outcome and the answer (a reconciliation waits for one such answer
        per member, and a connection's next request behind it)."""
        answer, answered = _heartbeat_answer(response)
        write.then_also(answered)
        if write.done is None:  # else the group logic added its records to a write of this turn already queued
            self.append_in_turn(self.shard_for(write.group_id).partition, write)
        return answer

    async def consumer_group_describe(self, group_ids: list[str]) -> list[DescribedConsumerGroup]:
        return self.consumer_groups.describe(group_ids)

    async def leave_group(self, req: LeaveGroupRequest) -> LeaveGroupResponse:
        return await self._spanned("LeaveGroup", self._leave_group, req)

    def _spanned(self, api: str, serve: Callable[[Q], Awaitable[R]], req: Q) -> Awaitable[R]:
        """`serve(req)`, inside telemetry's span when tracing is on (`request_spans`)."""
        spans = self.request_spans
        return serve(req) if spans is None else spans(api, req, serve)

    async def _leave_group(self, req: LeaveGroupRequest) -> LeaveGroupResponse:
        consumer_group = self._mixed_group(req.group_id)
        if consumer_group is None:
            return await self._serve(req.group_id, leave.handle_leave_group, req)
        response, write = self.consumer_groups.classic_leave(consumer_group, req)
        if write is not None:
            [error] = await self._written(self._start(self.shard_for(req.group_id), [write]))
            if error != Errors.NONE:
                return LeaveGroupResponse(kafka4_append_error(error))
        return response

    async def commit_offsets(self, req: OffsetCommitRequest) -> OffsetCommitResponse:
        return await self._spanned("OffsetCommit", self._commit_offsets, req)

    async def _commit_offsets(self, req: OffsetCommitRequest) -> OffsetCommitResponse:
        return await self._serve(req.group_id, offsets.handle_commit_offsets, req)

    async def fetch_offsets(self, req: OffsetFetchRequest) -> OffsetFetchResponse:
        return offsets.handle_fetch_offsets(self.shard_for(req.group_id), req)

    async def delete_offsets(self, req: OffsetDeleteRequest) -> OffsetDeleteResponse:
        return await self._serve(req.group_id, offsets.handle_delete_offsets, req)

    async def describe_groups(self, req: DescribeGroupsRequest) -> DescribeGroupsResponse:
        return await self._spanned("DescribeGroups", self._describe_groups, req)

    async def _describe_groups(self, req: DescribeGroupsRequest) -> DescribeGroupsResponse:
        return DescribeGroupsResponse([admin.describe_group(self.shard_for(group_id), group_id, req.version)
                                       for group_id in req.groups])

    def describe_group(self, group_id: str, version: int = 5):  # type: ignore[no-untyped-def]
        return admin.describe_group(self.shard_for(group_id), group_id, version)

    async def list_groups(self, req: ListGroupsRequest) -> ListGroupsResponse:
        if not self.is_active:
            return ListGroupsResponse(Errors.COORDINATOR_NOT_AVAILABLE)
        error = Errors.COORDINATOR_LOAD_IN_PROGRESS if self.is_loading else Errors.NONE
        served = [s for s in self.shards if s.status in (ShardStatus.ACTIVE, ShardStatus.LOADING)]
        return ListGroupsResponse(error, [g for shard in served for g in admin.list_groups(shard, req)])

    async def delete_groups(self, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
        return await self._spanned("DeleteGroups", self._delete_groups, req)

    async def _delete_groups(self, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
        """Each shard deletes its groups; answered once every tombstone is written (KafkaApis de-duplicates)."""
        by_shard: dict[int, list[str]] = {}
        names = list(dict.fromkeys(req.groups_names))
        for group_id in names:
            by_shard.setdefault(self.shard_for(group_id).partition, []).append(group_id)
        results: dict[str, Errors] = {}
        outcomes: list[tuple[list[str], list[asyncio.Future[Errors]]]] = []
        for partition, group_ids in by_shard.items():
            shard = self.shards[partition]
            result = admin.handle_delete_groups(shard, group_ids)
            assert isinstance(result.response, admin.Deletions)
            results.update(result.response.results)
            pending = self._start(shard, result.writes)
            # a group whose earlier deletion is unanswered waits for that write (shield: it is not ours to cancel)
            pending.extend(asyncio.shield(w.done) for w in result.response.waiting.values() if w.done is not None)
            outcomes.append((group_ids, pending))
        # A failed write of a partition is every one of its groups' answer (GroupCoordinatorService.deleteGroups:
        # the shard's write fails, its whole result is the error), not reported deleted: the tombstones stay owed
        # and are sent again, but a crash before that would bring the group back.
        for group_ids, pending in outcomes:
            error = next((e for e in await self._written(pending) if e != Errors.NONE), Errors.NONE)
            if error != Errors.NONE:
                results.update(dict.fromkeys(group_ids, kafka4_append_error(error)))
        return DeleteGroupsResponse([DeletableGroupResult(g, results[g]) for g in names])

    async def expire_offsets(self) -> int:
        """One run of Kafka's offset cleanup over every active shard; returns once the tombstones are written."""
        if not self.is_active:
            return 0
        removed, visited = 0, 0
        pending: list[asyncio.Future[Errors]] = []
        slices: list[Awaitable[list[Errors]]] = []  # one wait per slice: no callback gathers every write
        for shard in self.shards:
            for groups, count, writes in offsets.expire_offsets(shard):
                removed += count
                pending.extend(self._start(shard, writes, by_request=False))
                visited += groups
                if visited >= offsets.EXPIRY_SLICE:  # a slice's worth done: let heartbeats be answered
                    slices.append(asyncio.ensure_future(self._written(pending)))
                    pending, visited = [], 0
                    await asyncio.sleep(0)
        slices.append(self._written(pending))
        await asyncio.gather(*slices)
        return removed

    # --- the write path ---------------------------------------------------------------------------------------
    async def _serve(self, group_id: str | None, handler: _Handler[Q, R], req: Q) -> R:
        outcome = self._begin(group_id, handler, req)
        if isinstance(outcome, (asyncio.Future, Coroutine)):
            return cast(R, await outcome)
        return outcome

    def _begin(self, group_id: str | None, handler: _Handler[Q, R], req: Q
               ) -> R | asyncio.Future[R] | Coroutine[Any, Any, R]:
        """The handler run and its writes queued: its response, the future group logic answers (a parked
        request: on success only from its write's `then`, after the acknowledgement, but an error such as a
        rebalance meanwhile may answer it before), or a coroutine that answers once the writes are acknowledged."""
        return self._begin_on(self.shard_for(group_id), handler, req)

    def _begin_on(self, shard: GroupShard, handler: _Handler[Q, R], req: Q
                  ) -> R | asyncio.Future[R] | Coroutine[Any, Any, R]:
        result = handler(shard, req)
        if not isinstance(result, Result):  # a handler that never writes returns its response (or future) itself
            return result
        writes = result.writes
        written = self._start(shard, writes) if writes else None
        response = result.response
        if isinstance(response, asyncio.Future):
            return response
        if written:
            return self._respond_when_written(result, written)
        return cast(R, response)

    async def _respond_when_written(self, result: Result[R], written: list[asyncio.Future[Errors]]) -> R:
        errors = await self._written(written)
        if result.respond is not None:
            return result.respond(errors)
        return cast(R, result.response)

    def _start(self, shard: GroupShard, writes: list[Write], by_request: bool = True
               ) -> list[asyncio.Future[Errors]]:
        """Queues a handler's writes, in order; returns their outcomes."""
        return [self._append(shard.partition, write, by_request) for write in writes]

    async def _written(self, done: list[asyncio.Future[Errors]]) -> list[Errors]:
        """The writes' outcomes; a cancelled request does not cancel them (they belong to the runtime)."""
        if not done:
            return []
        return list(await asyncio.shield(asyncio.gather(*done)))

    def _appender(self, partition: int) -> Callable[[Write], object]:
        """The shard's append for writes group logic makes on its own (a timer emptied a group)."""
        return lambda write: self._append(partition, write, False)

    def _append(self, partition: int, write: Write, by_request: bool) -> asyncio.Future[Errors]:
        """Queues the write with the store now, after the partition's writes waiting for the end of this loop turn
        (so a partition's writes reach Kafka in the order the shard made them); its outcome is awaited by a task
        of the runtime's."""
        if partition in self._in_turn:
            self._send_turn(partition)
        if write.classic_group_record:  # a write of the consumer group it replaced is no longer the group's latest
            self.consumer_groups.classic_record_written(write.group_id)
        loop = asyncio.get_running_loop()
        write.done = loop.create_future()
        write.sealed = True
        try:
            appended: Awaitable[None] = self.store.append(partition, write.records)
        except Exception as exc:  # a store bug: answered like any failed append
            appended = _failed(exc)
        self._await_appended(partition, [write], appended, by_request)
        return write.done

    def append_in_turn(self, partition: int, write: Write) -> asyncio.Future[Errors]:
        """A write whose answer may wait: while an append of the partition is in flight (its transaction being
        committed, which a new one would wait for anyway), queued for the end of this loop turn, when every write
        of the partition queued so in the turn goes to the store as one append (`store.append_together`: one
        transaction), as Kafka's runtime appends the records of one loop of its coordinator as one batch and
        answers each request once the batch is written; until then the group logic may add more records of the
        same group to it (`Write.sealed`). With nothing in flight it goes at once (waiting for the end of a busy
        turn would only delay it). A write queued directly meanwhile (`_append`) sends the turn's first: the
        partition's order is kept."""
        if not self.write_turns or (partition not in self._in_turn and not self._appending.get(partition)):
            return self._append(partition, write, True)
        loop = asyncio.get_running_loop()
        write.done = loop.create_future()
        waiting = self._in_turn.get(partition)
        if waiting is None:
            waiting = self._in_turn[partition] = []
            loop.call_soon(self._send_turn, partition)
        waiting.append(write)
        return write.done

    def _send_turn(self, partition: int) -> None:
        """The partition's writes of this turn, to the store together; writes that share an append (the same
        awaitable) are settled together, in the order they were made."""
        writes = self._in_turn.pop(partition, None)
        if not writes:
            return
        for write in writes:
            write.sealed = True
        try:
            appended = list(self.store.append_together(partition, [write.records for write in writes]))
        except Exception as exc:  # a store bug: answered like any failed append
            appended = [_failed(exc)] * len(writes)
        start = 0
        for end in range(1, len(writes) + 1):
            if end == len(writes) or appended[end] is not appended[start]:
                self._await_appended(partition, writes[start:end], appended[start], True)
                start = end

    def _await_appended(self, partition: int, writes: list[Write], appended: Awaitable[None],
                        by_request: bool) -> None:
        """The writes settled with the append's outcome: in the very call that settles it when the store's
        awaitable takes listeners (coordinator/storage/outcome.py: the Kafka store's, settled as the transaction's
        result reaches the loop), so the requests waiting are answered with no loop turn in between; else by a
        task that awaits it. Either is in `_tasks` until then (shutdown cancels it: the writes are settled as a
        cancelled append)."""
        self._appending[partition] = self._appending.get(partition, 0) + 1
        on_settled = getattr(appended, "on_settled", None)
        if on_settled is not None and isinstance(appended, asyncio.Future) and not appended.done():
            self._tasks[appended] = (partition, writes, appended, by_request)
            # in the appending request's context, as the task's step would run (a listener runs in the settler's)
            context, started = contextvars.copy_context(), time.perf_counter()
            on_settled(lambda outcome: context.run(self._appended, partition, writes, by_request, started, outcome))
            return
        task = asyncio.get_running_loop().create_task(self._append_then(partition, writes, appended, by_request))
        self._tasks[task] = (partition, writes, appended, by_request)  # a tuple: cheaper than a partial
        task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Future[Any]) -> None:
        self._tasks.pop(task, None)

    def _appended(self, partition: int, writes: list[Write], by_request: bool, started: float,
                  appended: asyncio.Future[None]) -> None:
        """`_append_then`'s settling, as the outcome's listener."""
        self._tasks.pop(appended, None)
        if appended.cancelled():
            error = Errors.COORDINATOR_NOT_AVAILABLE
        else:
            exc = appended.exception()
            error = Errors.NONE if exc is None else self._append_failure(partition, writes, exc)
        self._settle_or_hold(partition, writes, error, by_request, (time.perf_counter() - started) * 1000)

    @staticmethod
    def _append_failure(partition: int, writes: list[Write], exc: BaseException) -> Errors:
        if isinstance(exc, StoreError):
            exc.__traceback__ = None  # see _append_then
            return exc.error
        log.error("event=store_failed group=%s partition=%d records=%d writes=%d", writes[0].group_id, partition,
                  sum(len(write.records) for write in writes), len(writes), exc_info=exc)
        return Errors.UNKNOWN_SERVER_ERROR

    async def _append_then(self, partition: int, writes: list[Write], appended: Awaitable[None],
                           by_request: bool) -> None:
        """The writes of one store append settled in order with its outcome: all acknowledged, or all failed."""
        error = Errors.NONE
        started = time.perf_counter()
        try:
            await appended
        except StoreError as exc:
            error = exc.error
            # its traceback names this frame, which names `appended`, which holds it: a cycle per failed append,
            # kept until a full collection (rare under the collector's freeze policy); an expected error needs none
            exc.__traceback__ = None
        except asyncio.CancelledError:
            error = Errors.COORDINATOR_NOT_AVAILABLE
            raise
        except Exception:
            log.exception("event=store_failed group=%s partition=%d records=%d writes=%d", writes[0].group_id,
                          partition, sum(len(write.records) for write in writes), len(writes))
            error = Errors.UNKNOWN_SERVER_ERROR
        finally:
            self._settle_or_hold(partition, writes, error, by_request, (time.perf_counter() - started) * 1000)

    def _settle_or_hold(self, partition: int, writes: list[Write], error: Errors, by_request: bool,
                        elapsed_ms: float) -> None:
        held = self._held.get(partition) if self._held else None
        if held is None:
            self._settle_all(partition, writes, error, by_request, elapsed_ms)
        else:  # its partition's groups are being unloaded: settled after them (_unload_shards)
            held.append((writes, error, by_request, elapsed_ms))

    def _settle_if_never_started(self, partition: int, writes: list[Write], appended: Awaitable[None],
                                 by_request: bool) -> None:
        """A task cancelled before its first step (shutdown cancels the tasks of writes sent in that very loop
        turn: the turn's writes, a request read just before) never runs its body, so its `finally` does not settle
        the writes: settled here as a cancelled append is, or their requests would never be answered (Kafka's
        runtime fails every write it has not completed when it closes a partition). The append's outcome is
        given up as a cancelled await gives it up."""
        if writes[-1].done is None or writes[-1].done.done():  # settled by the task itself
            return
        if isinstance(appended, asyncio.Future):
            if not appended.cancel() and not appended.cancelled():
                appended.exception()  # done already: a failure nobody awaits is not reported as never retrieved
        self._settle_all(partition, writes, Errors.COORDINATOR_NOT_AVAILABLE, by_request, 0.0)

    def _settle_all(self, partition: int, writes: list[Write], error: Errors, by_request: bool,
                    elapsed_ms: float) -> None:
        self._appending[partition] -= 1
        for write in writes:
            try:
                self._observer.on_append_completed(write.group_id, partition, write.records, elapsed_ms,
                                                   error.name, by_request)
            finally:
                self._settle(write, error)

    @staticmethod
    def _settle(write: Write, error: Errors) -> None:
        try:
            if write.then is not None:
                write.then(error)
        except Exception:
            log.exception("event=write_callback_failed group=%s records=%d", write.group_id, len(write.records))
        finally:
            if write.done is not None and not write.done.done():
                write.done.set_result(error)

    # --- loading and unloading (§7.4, §7.5) -------------------------------------------------------------------
    def begin_loading(self, partitions: Collection[int] | None = None) -> None:
        """Their groups' requests get COORDINATOR_LOAD_IN_PROGRESS (Heartbeat: NONE, SyncGroup:
        REBALANCE_IN_PROGRESS) until `load` has materialised them."""
        for partition in self._partitions(partitions):
            self.shards[partition].status = ShardStatus.LOADING

    async def load(self, partitions: Collection[int] | None = None) -> int:
        """Read the partitions through the store and serve them, one partition at a time, yielding to the loop
        every few thousand groups. If the store fails the partitions stay LOADING and the error propagates
        (serving an empty state would look like every group was lost). Returns the groups loaded."""
        wanted = self._partitions(partitions)
        await self.wait_unloaded(wanted)  # a partition given up and taken back: its old groups gone first
        self.begin_loading(wanted)
        loaded = await self.store.load(wanted)
        by_partition: dict[int, list[str]] = {p: [] for p in wanted}
        for group_id in loaded.group_ids():
            partition = self.partition_for(group_id)
            if partition in by_partition:
                by_partition[partition].append(group_id)
            else:
                log.warning("event=load_skipped group=%s partition=%d reason=not_requested", group_id, partition)
        count = 0
        for partition, group_ids in by_partition.items():
            shard = self.shards[partition]
            for group_id in group_ids:
                shard.load_group(group_id, loaded.records_of(group_id))
                count += 1
                if count % self.load_slice == 0:
                    await asyncio.sleep(0)  # the shards already served keep answering meanwhile
            count += self.consumer_groups.load(shard, [r for r in loaded.consumer_records
                                                       if self.partition_for(r.group_id) == partition])
            count -= self._one_type_per_group(shard, loaded)
            if shard.status is ShardStatus.LOADING:  # not given up meanwhile (lost or fenced: step 2)
                self._follow_transactions(shard, loaded)
                shard.status = ShardStatus.ACTIVE if self.is_active else ShardStatus.STOPPED
        return count

    def _one_type_per_group(self, shard: GroupShard, loaded: LoadedGroups) -> int:
        """A group id the load made of both types keeps the one whose records were written last; the other's
        records are tombstoned. Kafka's log never holds both (a conversion is one append, a failed one is not in
        the log); ours can: the write that tombstoned one type timed out, was lost or was owed when its instance
        stopped, while later writes of the other type landed (seeds 1623 and 2137 of --protocol upgrade: a classic
        record older than the consumer group's records reloaded as the classic group, which the next heartbeat
        converted again over the consumer group's members). Returns how many groups went."""
        both = [g for g in shard.consumer_groups if g in loaded.groups and g in loaded.classic_read_at]
        if not both:
            return 0
        last_read: dict[str, int] = {}
        for index, record in enumerate(loaded.consumer_records):
            if record.group_id in shard.consumer_groups:
                last_read[record.group_id] = index
        for group_id in both:
            consumer_group = shard.consumer_groups[group_id]
            classic = shard.groups.get(group_id)
            if last_read.get(group_id, -1) >= loaded.classic_read_at[group_id]:
                if classic is not None:  # the consumer group stands: the classic group gives way, offsets kept
                    shard.unload_group(classic, Errors.NOT_COORDINATOR)
                    classic.hand_offsets_to(shard.add_group(group_id))
                log.warning("event=load_superseded group=%s type=classic", group_id)
                shard.append(Write(group_id, [GroupMetadataRecord(group_id, None)]))
            else:
                log.warning("event=load_superseded group=%s type=consumer", group_id)
                self.consumer_groups.superseded_at_load(shard, consumer_group)
        return len(both)

    def _follow_transactions(self, shard: GroupShard, loaded: LoadedGroups) -> None:
        """The clients' transactions the load left open become pending offsets (after the groups are loaded:
        replaying creates a group it does not know), and the partition's tail settles them with their markers;
        the store tells the shard where our tombstones land (a client's batch before one is dropped)."""
        partition = shard.partition
        replay_transaction_events(shard, loaded.open_transactions.get(partition, ()), loaded.read_to.get(partition))
        start = loaded.read_to.get(partition)
        if start is not None:
            def deliver(events: list[TransactionEvent], read_to: int) -> None:
                replay_transaction_events(shard, events, read_to)
            self.store.follow_transactions(partition, start, deliver)
            follow_own_tombstones(shard, self.store)

    async def unload(self, partitions: Collection[int]) -> None:
        """Give the partitions up: parked requests of their groups get NOT_COORDINATOR, their groups and
        delayed operations go, requests for them get NOT_COORDINATOR, the store stops writing to them. The groups
        go a slice per loop turn (`_unload_shards`); their writes' outcomes are settled once they are gone."""
        wanted = list(partitions)
        for partition in wanted:
            self.shards[partition].status = ShardStatus.UNOWNED
        await self._unload_alone(wanted)
        await self.store.unload(wanted)

    def give_up(self, partitions: Collection[int]) -> None:
        """Stop serving the partitions now, from a callback that cannot wait (a partition lost or fenced, the
        instance stalled, a load stopped: cluster/ownership.py): from here on their groups' requests get
        NOT_COORDINATOR, their timers do nothing (the shard's `given_up`) and their writes' outcomes are held; the
        groups themselves are unloaded by a task, a slice per loop turn, each parked request answered
        NOT_COORDINATOR as the task reaches its group. `unload` and `load` of these partitions wait for that task;
        the store keeps writing them until `unload`."""
        fresh = []
        for partition in partitions:
            self.shards[partition].status = ShardStatus.UNOWNED
            unloading = self._unloading.get(partition)
            if unloading is None or unloading.done():  # else the unload under way takes what the shard has
                self._held.setdefault(partition, [])  # held from now on, not from the task's first step
                fresh.append(partition)
        if not fresh:
            return
        task = asyncio.get_running_loop().create_task(self._unload_shards(fresh), name="unload-given-up")
        for partition in fresh:
            self._unloading[partition] = task
        task.add_done_callback(functools.partial(self._unloaded, fresh))

    def _unloaded(self, partitions: list[int], unloading: asyncio.Future[Any]) -> None:
        for partition in partitions:
            if self._unloading.get(partition) is unloading:
                del self._unloading[partition]
        if not unloading.cancelled() and unloading.exception() is not None:
            log.error("event=unload_failed partitions=%s", partitions, exc_info=unloading.exception())

    async def wait_unloaded(self, partitions: Collection[int] | None = None) -> None:
        """Until no unload of the partitions' groups is under way (`give_up`'s; None: any partition's)."""
        wanted = self._partitions(partitions)
        while running := {u for p in wanted if (u := self._unloading.get(p)) is not None and not u.done()}:
            await asyncio.wait(running)

    async def _unload_alone(self, partitions: list[int], held_error: Errors | None = None) -> None:
        """`_unload_shards` once no other unload of the partitions is under way, marked as under way itself
        meanwhile (a `give_up` then leaves the partitions to it)."""
        await self.wait_unloaded(partitions)
        marker: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for partition in partitions:
            self._unloading[partition] = marker
        try:
            await self._unload_shards(partitions, held_error)
        finally:
            marker.set_result(None)
            self._unloaded(partitions, marker)

    def unload_group(self, group: GroupMetadata, error: Errors = Errors.NOT_COORDINATOR) -> None:
        self.shard_for(group.group_id).unload_group(group, error)

    def _partitions(self, partitions: Collection[int] | None) -> list[int]:
        return list(range(self.num_partitions)) if partitions is None else list(partitions)

    async def _unload_shards(self, partitions: list[int], held_error: Errors | None = None) -> None:
        """The groups of shards already given up (UNOWNED, STOPPED) unloaded a slice per loop turn, classic groups
        then consumer groups, shard by shard. No request reaches them meanwhile (the status) and their timers do
        nothing (`given_up`); the outcomes of their partitions' writes that come meanwhile are held
        (`_append_then`), so no write's callback runs on a half-unloaded shard: as with an unload in one loop
        callback, every parked request is answered by the unload, and those writes are settled after it, in the
        order their outcomes came, with their outcome or `held_error`. Cancelled meanwhile, it finishes the unload
        in that callback before it raises: no shard is left half unloaded."""
        for partition in partitions:
            self._held.setdefault(partition, [])
        budget = self.unload_slice
        cancelled: asyncio.CancelledError | None = None
        try:
            for partition in partitions:
                shard = self.shards[partition]
                steps = itertools.chain(shard.unload_stepwise(Errors.NOT_COORDINATOR),
                                        self.consumer_groups.unload_stepwise(shard))
                for unloaded in steps:
                    budget -= unloaded
                    if budget <= 0 and cancelled is None:
                        budget = self.unload_slice
                        try:
                            await asyncio.sleep(0)
                        except asyncio.CancelledError as exc:
                            cancelled = exc
        finally:
            for partition in partitions:
                for writes, outcome, by_request, elapsed_ms in self._held.pop(partition, ()):
                    error = outcome if held_error is None else held_error
                    self._settle_all(partition, writes, error, by_request, elapsed_ms)
        if cancelled is not None:
            raise cancelled

    async def shutdown(self) -> None:
        """Stop serving: parked requests get NOT_COORDINATOR (clients rediscover), pending writes finish or are
        cancelled, delayed operations are dropped. The timer belongs to the caller."""
        self.is_active = False
        every = list(range(self.num_partitions))
        for shard in self.shards:  # first: no request reaches a group while the unload spans loop turns
            shard.status = ShardStatus.STOPPED
        # a write whose outcome comes during the unload is settled as the cancel below settles the others (an
        # unload in one loop callback would have cancelled it with them)
        await self._unload_alone(every, held_error=Errors.COORDINATOR_NOT_AVAILABLE)
        for partition in list(self._in_turn):  # sent now: their tasks are cancelled with the others below
            self._send_turn(partition)
        tasks = list(self._tasks.items())
        for task, _ in tasks:
            task.cancel()
        await asyncio.gather(*(task for task, _ in tasks), return_exceptions=True)
        for task, append in tasks:
            if append is not None and task.cancelled():
                self._settle_if_never_started(*append)
        await self.consumer_groups.group_configs.close()
        await self.heartbeat_purgatory.shutdown()
        await self.rebalance_purgatory.shutdown()


def _failed(exc: Exception) -> asyncio.Future[None]:
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed.set_exception(exc.with_traceback(None))  # a raised one's frames may hold this future: no cycle
    return failed


def _heartbeat_answer(response: HeartbeatResponseV2
                      ) -> tuple[asyncio.Future[HeartbeatResponseV2], Callable[[Errors], None]]:
    """A parked ConsumerGroupHeartbeat's answer, and what gives it once the write it waits for is settled:
    `response` if acknowledged, else Kafka 4's error for the write; handed over by `answer_parked`, so the
    connection waiting for it writes it in that very settling."""
    answer: asyncio.Future[HeartbeatResponseV2] = asyncio.get_running_loop().create_future()

    def answered(error: Errors) -> None:
        if not answer.done():
            answer_parked(answer, response if error == Errors.NONE
                          else HeartbeatResponseV2(kafka4_append_error(error)))

    return answer, answered


class _GroupsView(Mapping[str, GroupMetadata]):
    """Every shard's groups, read-only (for tools, logs and tests)."""

    def __init__(self, shards: list[GroupShard]) -> None:
        self._shards = shards

    def __getitem__(self, group_id: str) -> GroupMetadata:
        if group_id is None:
            raise KeyError(group_id)
        return self._shards[cached_partition_for(group_id, len(self._shards))].groups[group_id]

    def __iter__(self) -> Iterator[str]:
        for shard in self._shards:
            yield from list(shard.groups)

    def __len__(self) -> int:
        return sum(len(shard.groups) for shard in self._shards)

    def values(self) -> ValuesView[GroupMetadata]:
        return _GroupValues(self)


class _GroupValues(ValuesView[GroupMetadata]):
    """Straight from the shards' dicts: the generic view would look each id's shard up again (hashing it)."""

    _mapping: _GroupsView

    def __iter__(self) -> Iterator[GroupMetadata]:
        for shard in self._mapping._shards:
            yield from list(shard.groups.values())


def _some_names(names: list[str]) -> str:
    """Up to _NAMES_LOGGED names for a log line, then how many more."""
    shown = ",".join(names[:_NAMES_LOGGED])
    return shown if len(names) <= _NAMES_LOGGED else f"{shown},...(+{len(names) - _NAMES_LOGGED})"
