"""Simulated consumers: the classic protocol as Kafka's Java consumer speaks it, against the runtime's typed API.

A consumer joins (the MEMBER_ID_REQUIRED round trip of JoinGroup v4+, or straight in with a group.instance.id),
syncs (the leader assigns with the range assignor over the members' subscriptions), fetches its partitions'
committed offsets (require_stable, retried on UNSTABLE_OFFSET_COMMIT), then heartbeats every heartbeat interval
and commits every commit interval until told to rebalance. Like the Java client it commits before it rejoins
on REBALANCE_IN_PROGRESS (eager revocation), forgets its member id and generation on UNKNOWN_MEMBER_ID and
ILLEGAL_GENERATION, backs off and retries on COORDINATOR_LOAD_IN_PROGRESS / COORDINATOR_NOT_AVAILABLE /
NOT_COORDINATOR and dropped connections, and stops for good on FENCED_INSTANCE_ID.

Committed offsets come from one counter per partition shared by every consumer of the run, so a later commit
always carries a larger offset: an offset that goes backwards is a lost or reordered commit, never a
legitimate one.

Faults act on a consumer from outside: `hang_until` (the process stops sending, its sessions run out), a latency
factor (slowness), and cancelling its task (a crash: no LeaveGroup).
"""
from __future__ import annotations

import asyncio
import random
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator.group.api import (DeleteGroupsRequest, DescribeGroupsRequest, ListGroupsRequest,
                                   OffsetDeleteRequest, OffsetDeleteRequestTopic, JoinGroupProtocol, JoinGroupRequest, LeaveGroupRequest, MemberIdentity,
                                   OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
                                   OffsetFetchRequest, OffsetFetchRequestTopic, SyncGroupRequest,
                                   SyncGroupRequestAssignment, HeartbeatRequest)
from coordinator.loadgen.assignors import range_assign
from protocol.consumer_protocol import (Subscription, decode_assignment, decode_subscription, encode_assignment,
                                        encode_subscription)
from protocol.error_codes import Errors
from simulator.instance import Disconnected, Route

if TYPE_CHECKING:
    from simulator.run import Simulation

RETRIABLE = frozenset({Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE,
                       Errors.NOT_COORDINATOR, Errors.REQUEST_TIMED_OUT})
RESET = frozenset({Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION})
# What a classic consumer may hear from a coordinator; anything else is reported.
FATAL = frozenset({Errors.FENCED_INSTANCE_ID, Errors.GROUP_MAX_SIZE_REACHED})  # the Java consumer gives up
EXPECTED = frozenset({Errors.NONE, Errors.MEMBER_ID_REQUIRED, Errors.REBALANCE_IN_PROGRESS,
                      Errors.UNSTABLE_OFFSET_COMMIT}) | RETRIABLE | RESET | FATAL


@dataclass(frozen=True)
class MemberSpec:
    name: str  # client.id
    instance_id: str | None  # group.instance.id: a static member
    session_ms: int
    rebalance_ms: int
    heartbeat_ms: int
    commit_ms: int
    join_version: int = 9


class Fenced(Exception):
    """FENCED_INSTANCE_ID or GROUP_MAX_SIZE_REACHED: the Java consumer raises it to the application."""


class Rejoin(Exception):
    """Leave the steady loop and join again."""


class SimConsumer:
    def __init__(self, sim: Simulation, group_id: str, topics: dict[str, int], spec: MemberSpec,
                 incarnation: int) -> None:
        self.sim = sim
        self.group_id = group_id
        self.topics = topics
        self.spec = spec
        self.name = f"{spec.name}#{incarnation}"
        self.member_id = ""
        self.generation = -1
        self.owned: list[tuple[str, int]] = []
        self.hang_until_ms = 0
        self.slow_factor = 1
        self.subscribed = tuple(sorted(topics))
        self.subscription = encode_subscription(Subscription(self.subscribed))
        self.rejoin_needed = False
        self.task: asyncio.Task[None] | None = None
        self.route = Route()

    # --- the consumer's life ----------------------------------------------------------------------------------
    def start(self) -> None:
        self.task = self.sim.loop.create_task(self._live(), name=self.name)

    def crash(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self._own([])

    def _own(self, owned: list[tuple[str, int]]) -> None:
        """What the consumer owns from now on, for the checkers of a group that may be a consumer group (an
        online upgrade): eager, it gives up everything before it rejoins or leaves."""
        self.owned = owned
        self.sim.checkers.claim(self.group_id, self.name, self.member_id, frozenset(owned))

    def resubscribe(self, topics: tuple[str, ...]) -> None:
        """subscribe() with another topic list: the next poll rejoins with the new metadata."""
        self.subscribed = tuple(sorted(topics))
        self.subscription = encode_subscription(Subscription(self.subscribed))
        self.rejoin_needed = True

    async def leave(self) -> None:
        """Close the consumer: a dynamic member leaves the group (a static one just goes, as Java's does)."""
        if self.task is not None:
            self.task.cancel()
        self._own([])
        if self.spec.instance_id is None and self.member_id:
            request = LeaveGroupRequest(self.group_id, [MemberIdentity(self.member_id, None, "closing")],
                                        client_id=self.name)
            try:
                await self._call("leave_group", request)
            except Disconnected:
                pass

    async def _live(self) -> None:
        try:
            while True:
                try:
                    await self._join_and_sync()
                    await self._fetch_offsets()
                    await self._steady()
                except Rejoin:
                    continue
        except Fenced as exc:
            self.sim.history.record("gave_up", client=self.name, member=self.member_id, error=str(exc))

    # --- join and sync ----------------------------------------------------------------------------------------
    async def _join_and_sync(self) -> None:
        self._own([])  # onPartitionsRevoked before it rejoins (eager)
        while True:
            response = await self._join()
            assignments: list[SyncGroupRequestAssignment] = []
            if response.leader == self.member_id and not response.skip_assignment:
                subscriptions = {m.member_id: decode_subscription(m.metadata)[1] for m in response.members}
                assigned = range_assign(subscriptions, self.topics)
                assignments = [SyncGroupRequestAssignment(member, encode_assignment(assignment))
                               for member, assignment in assigned.items()]
            request = SyncGroupRequest(self.group_id, self.generation, self.member_id, self.spec.instance_id,
                                       "consumer", "range", assignments, client_id=self.name)
            sync = await self._request("sync_group", request)
            if sync is None:
                continue
            error = sync.error_code
            if error == Errors.NONE:
                _, assignment = decode_assignment(sync.assignment) if sync.assignment else (0, None)
                self._own([(topic, p) for topic, partitions in assignment.partitions for p in partitions]
                          if assignment is not None else [])
                self.sim.history.record("assigned", client=self.name, group=self.group_id, member=self.member_id,
                                        gen=self.generation, partitions=tuple(self.owned))
                # a static member's restart takes over its assignment under a new member id: the owner is the instance
                owner = self.spec.instance_id or self.member_id
                self.sim.checkers.assigned(self.group_id, self.generation, owner, self.owned, sync)
                return
            self._on_error(error, "sync")

    async def _join(self) -> Any:
        while True:
            request = JoinGroupRequest(self.group_id, self.spec.session_ms, self.spec.rebalance_ms, self.member_id,
                                       self.spec.instance_id, "consumer",
                                       [JoinGroupProtocol("range", self.subscription)],
                                       version=self.spec.join_version, client_id=self.name,
                                       client_host=f"/10.0.0.{zlib.crc32(self.spec.name.encode()) % 250 + 1}")
            response = await self._request("join_group", request)
            if response is None:
                continue
            error = response.error_code
            if error == Errors.NONE:
                self.member_id = response.member_id
                self.generation = response.generation_id
                return response
            if error == Errors.MEMBER_ID_REQUIRED:
                self.member_id = response.member_id
                continue
            try:
                self._on_error(error, "join")
            except Rejoin:
                continue

    # --- while a member of the generation ---------------------------------------------------------------------
    async def _fetch_offsets(self) -> None:
        if not self.owned:
            return
        by_topic: dict[str, list[int]] = {}
        for topic, partition in self.owned:
            by_topic.setdefault(topic, []).append(partition)
        request = OffsetFetchRequest(self.group_id, [OffsetFetchRequestTopic(t, ps) for t, ps in by_topic.items()],
                                     require_stable=True)
        while True:
            sent_ms = self.sim.now_ms()
            response = await self._request("fetch_offsets", request)
            if response is None:
                continue
            if response.error_code != Errors.NONE:
                self._on_error(response.error_code, "fetch")
                continue
            unstable = [p for t in response.topics for p in t.partitions
                        if p.error_code == Errors.UNSTABLE_OFFSET_COMMIT]
            if unstable:
                await self._sleep(self.sim.rng_client.randint(50, 300))
                continue
            for topic in response.topics:
                for p in topic.partitions:
                    self.sim.checkers.fetched(self.group_id, (topic.name, p.partition_index), p.committed_offset,
                                              self.name, sent_ms)
            return

    async def _steady(self) -> None:
        rng = self.sim.rng_client
        now = self.sim.now_ms
        next_heartbeat = now() + self.spec.heartbeat_ms
        next_commit = now() + rng.randint(0, self.spec.commit_ms)
        while True:
            wake = min(next_heartbeat, next_commit)
            await self._sleep(max(wake - now(), 0))
            if self.rejoin_needed:
                self.rejoin_needed = False
                await self._commit()
                raise Rejoin()
            if now() >= next_commit:
                next_commit = now() + self.spec.commit_ms
                await self._commit()
            if now() >= next_heartbeat:
                next_heartbeat = now() + self.spec.heartbeat_ms
                await self._heartbeat()

    async def _heartbeat(self) -> None:
        request = HeartbeatRequest(self.group_id, self.generation, self.member_id, self.spec.instance_id)
        response = await self._request("heartbeat", request)
        if response is None or response.error_code == Errors.NONE:
            return
        if response.error_code == Errors.REBALANCE_IN_PROGRESS:
            await self._commit()  # eager revocation: commit what was consumed, then rejoin
        self._on_error(response.error_code, "heartbeat")

    async def _commit(self) -> None:
        if not self.owned:
            return
        offsets = {tp: self.sim.next_offset(self.group_id, tp) for tp in self.owned}
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for (topic, partition), offset in offsets.items():
            by_topic.setdefault(topic, []).append(OffsetCommitRequestPartition(partition, offset,
                                                                               committed_metadata=self.name))
        request = OffsetCommitRequest(self.group_id, self.generation, self.member_id,
                                      [OffsetCommitRequestTopic(t, ps) for t, ps in by_topic.items()],
                                      self.spec.instance_id)
        response = await self._request("commit_offsets", request)
        if response is None:
            return
        errors = {p.error_code for t in response.topics for p in t.partitions}
        for topic in response.topics:
            for p in topic.partitions:
                if p.error_code == Errors.NONE:
                    tp = (topic.name, p.partition_index)
                    self.sim.checkers.committed(self.group_id, tp, offsets[tp], self.name)
        for error in errors - {Errors.NONE}:
            if error in RETRIABLE:
                continue
            self._on_error(error, "commit")

    # --- errors and the wire ----------------------------------------------------------------------------------
    def _on_error(self, error: Errors, api: str) -> None:
        """Raises Rejoin (or Fenced); returns for errors the caller just retries after a back-off."""
        if error not in EXPECTED:
            self.sim.checkers.unexpected_error(self.name, api, error)
        if error in FATAL:
            raise Fenced(error.name)
        if error in RESET:
            self._own([])
            self.member_id, self.generation = "", -1
            raise Rejoin()
        if error in RETRIABLE and api in ("heartbeat", "commit", "fetch"):
            return
        raise Rejoin()

    async def _request(self, api: str, request: Any) -> Any:
        """The response, or None after a back-off when the connection failed."""
        try:
            response = await self._call(api, request)
        except Disconnected:
            await self._sleep(self.sim.rng_client.randint(100, 1_000))
            return None
        error = getattr(response, "error_code", None)
        if error in RETRIABLE and api in ("join_group", "sync_group", "fetch_offsets"):
            await self._sleep(self.sim.rng_client.randint(100, 1_000))  # retry.backoff.ms, with jitter
        return response

    async def _call(self, api: str, request: Any) -> Any:
        sim = self.sim
        if self.hang_until_ms > sim.now_ms():
            await self._sleep(self.hang_until_ms - sim.now_ms())
        return await sim.call(self.name, self.member_id, api, request, self.slow_factor, route=self.route)

    async def _sleep(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)


class SimAdmin:
    """An operator with the admin client: now and then resets a group's offsets (an OffsetCommit with
    generation -1, as `kafka-consumer-groups --reset-offsets` does; only an Empty group accepts it), deletes a
    group's offsets or the group itself (only Empty groups), describes and lists groups."""

    def __init__(self, sim: Simulation, groups: dict[str, dict[str, int]], every_ms: tuple[int, int]) -> None:
        self.sim = sim
        self.groups = groups  # what run() draws from
        self.topics = dict(groups)  # the topics of every group it operates on
        self.every_ms = every_ms
        self.name = "admin"

    async def run(self) -> None:
        rng = self.sim.rng_client
        while True:
            await asyncio.sleep(rng.randint(*self.every_ms) / 1000)
            group_id = rng.choice(sorted(self.groups))
            operation = rng.choice(("reset", "reset", "delete_offsets", "delete_group", "describe", "list"))
            try:
                await getattr(self, f"_{operation}")(group_id)
            except Disconnected:
                pass

    async def run_on_transactional_groups(self, groups: dict[str, dict[str, int]], rng: random.Random) -> None:
        """The same operator on the applications' groups, drawn apart: deletes their offsets or the group (what
        a pending transaction holds too), describes them; no resets (their offsets come from transactions)."""
        self.topics.update(groups)
        while True:
            await asyncio.sleep(rng.randint(*self.every_ms) / 1000)
            group_id = rng.choice(sorted(groups))
            operation = rng.choice(("delete_offsets", "delete_offsets", "delete_group", "describe"))
            try:
                await getattr(self, f"_{operation}")(group_id)
            except Disconnected:
                pass

    async def _reset(self, group_id: str) -> None:
        topics = self.groups[group_id]
        offsets = {(t, p): self.sim.next_offset(group_id, (t, p)) for t, n in topics.items() for p in range(n)}
        request = OffsetCommitRequest(group_id, -1, "", [
            OffsetCommitRequestTopic(t, [OffsetCommitRequestPartition(p, offsets[(t, p)], committed_metadata="reset")
                                         for p in range(n)]) for t, n in topics.items()])
        response = await self.sim.call(self.name, "", "commit_offsets", request)
        for topic in response.topics:
            for p in topic.partitions:
                if p.error_code == Errors.NONE:
                    tp = (topic.name, p.partition_index)
                    self.sim.checkers.committed(group_id, tp, offsets[tp], self.name)

    async def _delete_offsets(self, group_id: str) -> None:
        request = OffsetDeleteRequest(group_id, [OffsetDeleteRequestTopic(t, list(range(n)))
                                                 for t, n in self.topics[group_id].items()])
        sent_at = len(self.sim.ledger.writes)
        response = await self.sim.call(self.name, "", "delete_offsets", request)
        deleted = [(t.name, p.partition_index) for t in response.topics for p in t.partitions
                   if response.error_code == Errors.NONE and p.error_code == Errors.NONE]
        self.sim.checkers.deleted(group_id, deleted, group_record=False, sent_at=sent_at)

    async def _delete_group(self, group_id: str) -> None:
        sent_at = len(self.sim.ledger.writes)
        response = await self.sim.call(self.name, "", "delete_groups", DeleteGroupsRequest([group_id]))
        if response.results[0].error_code == Errors.NONE:
            topics = self.topics[group_id]
            self.sim.checkers.deleted(group_id, [(t, p) for t, n in topics.items() for p in range(n)],
                                      group_record=True, sent_at=sent_at)

    async def _describe(self, group_id: str) -> None:
        await self.sim.call(self.name, "", "describe_groups", DescribeGroupsRequest([group_id]))

    async def _list(self, group_id: str) -> None:
        await self.sim.call(self.name, "", "list_groups", ListGroupsRequest())
