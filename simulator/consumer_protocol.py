"""Simulated consumers of KIP-848's consumer protocol, as Kafka's Java consumer (AsyncKafkaConsumer and its
ConsumerMembershipManager) speaks it, against the runtime's typed ConsumerGroupHeartbeat.

A consumer makes up its member id once (a v1 client does) and keeps it for its life. It joins with epoch 0 and
every field, then heartbeats at the interval the coordinator gives, sending only what changed since the last
heartbeat that was answered (everything again after a failure, as the Java client resets its sent fields).
When an answer carries an assignment it reconciles: it commits the offsets of the partitions it must give up,
stops owning them, starts owning the new ones (fetching their committed offsets) and acknowledges at once with a
heartbeat that reports what it owns. On FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID it loses every partition (no
commit) and rejoins with epoch 0 and the same member id; on a coordinator error it backs off and tries again;
FENCED_INSTANCE_ID, UNRELEASED_INSTANCE_ID and GROUP_MAX_SIZE_REACHED end it, as they raise in the Java client.
Closing commits, revokes, then leaves with epoch -1 (a static member with -2, to come back as itself). Offsets
are committed with the member epoch (OffsetCommit v9).

What a consumer owns is reported to the checkers (`Checkers.claim`) as it changes: the invariants compare it with
what the coordinator hands out.
"""
from __future__ import annotations

import asyncio
import uuid
import zlib
from typing import TYPE_CHECKING, Any

from coordinator.group.api import (OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
                                   OffsetFetchRequest, OffsetFetchRequestTopic)
from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.modern.member import LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH
from coordinator.topics import StaticTopics, TopicImage
from protocol.error_codes import Errors
from simulator.clients import RETRIABLE, MemberSpec
from simulator.instance import Disconnected, Route

if TYPE_CHECKING:
    from simulator.run import Simulation

Owned = frozenset[tuple[str, int]]
REJOIN = frozenset({Errors.FENCED_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID})
FATAL = frozenset({Errors.FENCED_INSTANCE_ID, Errors.UNRELEASED_INSTANCE_ID, Errors.GROUP_MAX_SIZE_REACHED})
# A commit the coordinator refuses for the member's epoch: the Java consumer reports it and goes on.
COMMIT_REFUSED = frozenset({Errors.STALE_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID, Errors.FENCED_MEMBER_EPOCH})


def topic_id(name: str) -> uuid.UUID:
    """A topic's id in the simulated cluster: fixed by its name, so every instance and seed agree."""
    return uuid.UUID(bytes=zlib.crc32(name.encode()).to_bytes(4, "big") * 4)


def cluster_topics(topics: dict[str, int]) -> StaticTopics:
    """The cluster's topics as the coordinator's metadata shows them."""
    return StaticTopics(TopicImage(topic_id(name), name, partitions) for name, partitions in sorted(topics.items()))


class Fatal(Exception):
    """An error the Java consumer raises to the application: the consumer ends."""


class ConsumerProtocolConsumer:
    def __init__(self, sim: Simulation, group_id: str, topics: dict[str, int], spec: MemberSpec,
                 incarnation: int) -> None:
        self.sim = sim
        self.group_id = group_id
        self.topics = topics
        self.spec = spec
        self.name = f"{spec.name}#{incarnation}"
        self.member_id = str(uuid.UUID(int=sim.rng_client.getrandbits(128), version=4))
        sim.checkers.consumer_protocol_members.add(self.member_id)
        self.epoch = 0
        self.owned: Owned = frozenset()
        self.interval_ms = 5_000
        self.hang_until_ms = 0
        self.slow_factor = 1
        self.subscribed = tuple(sorted(topics))
        self.rejoin_needed = False
        self._sent: tuple[tuple[str, ...], Owned] | None = None  # what the last answered heartbeat reported
        self.task: asyncio.Task[None] | None = None
        self.route = Route()

    # --- the consumer's life ----------------------------------------------------------------------------------
    def start(self) -> None:
        self.task = self.sim.loop.create_task(self._live(), name=self.name)

    def crash(self) -> None:
        """The process dies: it owns nothing any more, and tells nobody."""
        if self.task is not None:
            self.task.cancel()
        self._own(frozenset())

    def resubscribe(self, topics: tuple[str, ...]) -> None:
        """subscribe() with another topic list: the next heartbeat carries it."""
        self.subscribed = tuple(sorted(topics))
        self.rejoin_needed = True

    async def leave(self) -> None:
        """close(): commit, revoke everything, then leave (-1; -2 for a static member, which may come back)."""
        if self.task is not None:
            self.task.cancel()
        if self.epoch <= 0:
            self._own(frozenset())
            return
        try:
            await self._commit(self.owned)
            self._own(frozenset())
            epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH if self.spec.instance_id else LEAVE_GROUP_MEMBER_EPOCH
            await self._call("consumer_group_heartbeat", HeartbeatRequest(
                self.group_id, self.member_id, epoch, instance_id=self.spec.instance_id, client_id=self.name))
        except (Disconnected, Fatal):
            pass
        finally:
            self._own(frozenset())

    async def _live(self) -> None:
        rng = self.sim.rng_client
        next_commit = self.sim.now_ms() + rng.randint(0, self.spec.commit_ms)
        try:
            while True:
                response = await self._heartbeat()
                if response is None:
                    await self._backoff()
                    continue
                acknowledge = self._on_answer(response)
                if response.error == Errors.NONE and response.assignment is not None:
                    acknowledge = await self._reconcile(response.assignment) or acknowledge
                if response.error != Errors.NONE:
                    await self._backoff()
                    continue
                if acknowledge:
                    continue
                next_heartbeat = self.sim.now_ms() + self.interval_ms
                while self.sim.now_ms() < next_heartbeat and not self.rejoin_needed:
                    await self._sleep(max(min(next_heartbeat, next_commit) - self.sim.now_ms(), 0))
                    if self.sim.now_ms() >= next_commit:
                        next_commit = self.sim.now_ms() + self.spec.commit_ms
                        await self._commit(self.owned)
                self.rejoin_needed = False
        except Fatal as exc:
            self._own(frozenset())
            self.sim.history.record("gave_up", client=self.name, member=self.member_id, error=str(exc))

    # --- the heartbeat ----------------------------------------------------------------------------------------
    async def _heartbeat(self) -> HeartbeatResponse | None:
        full = self.epoch == 0 or self._sent is None
        names = self.subscribed if full or self._sent is None or self._sent[0] != self.subscribed else None
        owned_changed = full or self._sent is None or self._sent[1] != self.owned
        request = HeartbeatRequest(
            self.group_id, self.member_id, self.epoch, instance_id=self.spec.instance_id,
            rebalance_timeout_ms=self.spec.rebalance_ms if full else -1, subscribed_topic_names=names,
            owned=(() if self.epoch == 0 else self._owned_by_id()) if owned_changed else None,
            client_id=self.name,
            client_host=f"/10.0.0.{zlib.crc32(self.spec.name.encode()) % 250 + 1}")
        reported = (self.subscribed, frozenset() if self.epoch == 0 else self.owned)
        try:
            response = await self._call("consumer_group_heartbeat", request)
        except Disconnected:
            self._sent = None
            return None
        self._sent = reported if response.error == Errors.NONE else None
        return response

    def _on_answer(self, response: HeartbeatResponse) -> bool:
        """The member's new epoch and interval, or what an error means; True: heartbeat again at once."""
        error = response.error
        if error == Errors.NONE:
            if response.member_id:
                self.member_id = response.member_id
            joined = self.epoch == 0
            self.epoch = response.member_epoch
            self.interval_ms = response.heartbeat_interval_ms or self.interval_ms
            if joined:
                self.sim.history.record("joined", client=self.name, group=self.group_id, member=self.member_id,
                                        epoch=self.epoch)
            return False
        if error in REJOIN:  # onPartitionsLost: nothing is committed, everything goes, rejoin with epoch 0
            self.sim.history.record("fenced", client=self.name, member=self.member_id, error=error.name)
            self._own(frozenset())
            self.epoch = 0
            return True
        if error in FATAL:
            raise Fatal(error.name)
        if error == Errors.GROUP_ID_NOT_FOUND:
            # the operator deleted the group (Empty: this member was gone), it went back to classic while this
            # member was away (fenced, its group downgraded), or joining, its classic group cannot be converted
            # (in its first rebalance): fatal in the Java consumer. The checkers judge the answer
            # (Checkers._not_a_consumer_group).
            raise Fatal(error.name)
        if error not in RETRIABLE:
            self.sim.checkers.unexpected_error(self.name, "consumer_group_heartbeat", error)
        return False

    async def _reconcile(self, assignment: dict[uuid.UUID, Any]) -> bool:
        """Revoke (after committing), then assign; True when what the member owns changed (it acknowledges)."""
        target = frozenset((image.name, p) for tid, ps in assignment.items()
                           if (image := self.sim.topics.by_id(tid)) is not None for p in ps)
        revoked, added = self.owned - target, target - self.owned
        if not revoked and not added:
            return False
        if revoked:
            await self._commit(revoked)
            self._own(self.owned - revoked)
        if added:
            self._own(self.owned | added)
            await self._fetch_offsets(added)
        self.sim.history.record("reconciled", client=self.name, member=self.member_id, epoch=self.epoch,
                                owned=tuple(sorted(self.owned)))
        return True

    def _own(self, owned: Owned) -> None:
        self.owned = owned
        self.sim.checkers.claim(self.group_id, self.name, self.member_id, owned)

    def _owned_by_id(self) -> list[tuple[uuid.UUID, list[int]]]:
        by_topic: dict[str, list[int]] = {}
        for name, partition in sorted(self.owned):
            by_topic.setdefault(name, []).append(partition)
        return [(topic_id(name), ps) for name, ps in by_topic.items()]

    # --- offsets ----------------------------------------------------------------------------------------------
    async def _commit(self, partitions: Owned) -> None:
        if not partitions or self.epoch <= 0:
            return
        offsets = {tp: self.sim.next_offset(self.group_id, tp) for tp in sorted(partitions)}
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for (name, partition), offset in offsets.items():
            by_topic.setdefault(name, []).append(OffsetCommitRequestPartition(partition, offset,
                                                                              committed_metadata=self.name))
        request = OffsetCommitRequest(self.group_id, self.epoch, self.member_id,
                                      [OffsetCommitRequestTopic(t, ps) for t, ps in by_topic.items()],
                                      self.spec.instance_id, version=9)
        try:
            response = await self._call("commit_offsets", request)
        except Disconnected:
            return
        fenced = False
        for topic in response.topics:
            for p in topic.partitions:
                tp = (topic.name, p.partition_index)
                if p.error_code == Errors.NONE:
                    self.sim.checkers.committed(self.group_id, tp, offsets[tp], self.name)
                elif p.error_code == Errors.ILLEGAL_GENERATION:
                    pass  # a classic group's refusal (the group went classic meanwhile): judged by the checkers
                elif p.error_code == Errors.FENCED_INSTANCE_ID:
                    # its instance id another member's now in the classic group it went back to (a zombie woken
                    # after a downgrade: Kafka's ClassicGroup.validateMember); fatal in the Java consumer
                    fenced = True
                elif p.error_code not in RETRIABLE | COMMIT_REFUSED:
                    self.sim.checkers.unexpected_error(self.name, "commit_offsets", p.error_code)
        if fenced:
            raise Fatal(Errors.FENCED_INSTANCE_ID.name)

    async def _fetch_offsets(self, partitions: Owned) -> None:
        by_topic: dict[str, list[int]] = {}
        for name, partition in sorted(partitions):
            by_topic.setdefault(name, []).append(partition)
        request = OffsetFetchRequest(self.group_id, [OffsetFetchRequestTopic(t, ps) for t, ps in by_topic.items()],
                                     require_stable=True, member_id=self.member_id, member_epoch=self.epoch)
        for _ in range(20):
            sent_ms = self.sim.now_ms()
            try:
                response = await self._call("fetch_offsets", request)
            except Disconnected:
                return
            if response.error_code in COMMIT_REFUSED | RETRIABLE:
                return  # the next heartbeat says what happened to the member
            if response.error_code != Errors.NONE:
                self.sim.checkers.unexpected_error(self.name, "fetch_offsets", response.error_code)
                return
            if any(p.error_code == Errors.UNSTABLE_OFFSET_COMMIT for t in response.topics for p in t.partitions):
                await self._sleep(self.sim.rng_client.randint(50, 300))
                continue
            for topic in response.topics:
                for p in topic.partitions:
                    self.sim.checkers.fetched(self.group_id, (topic.name, p.partition_index), p.committed_offset,
                                              self.name, sent_ms)
            return

    # --- the wire ---------------------------------------------------------------------------------------------
    async def _call(self, api: str, request: Any) -> Any:
        sim = self.sim
        if self.hang_until_ms > sim.now_ms():
            await self._sleep(self.hang_until_ms - sim.now_ms())
        return await sim.call(self.name, self.member_id, api, request, self.slow_factor, route=self.route)

    async def _backoff(self) -> None:
        await self._sleep(self.sim.rng_client.randint(100, 1_000))  # retry.backoff.ms, with jitter

    async def _sleep(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)
