"""A classic group's in-memory state (Kafka 3.9 `GroupMetadata.scala`): members, pending members, static
member map, protocol support counts, generation, leader, offsets. No timers and no I/O here."""
from __future__ import annotations

import asyncio
import logging
import struct
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from coordinator.group.api import JoinGroupResponseMember
from coordinator.group.member import MemberMetadata, Protocols, answer_parked
from coordinator.group.state import EMPTY, GroupState, IllegalStateTransition, VALID_PREVIOUS
from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord, TopicPartition

if TYPE_CHECKING:
    from coordinator.group.api import JoinGroupResponse, SyncGroupResponse
    from coordinator.group.observer import GroupObserver
    from coordinator.group.replacement_hold import ReplacementHold

log = logging.getLogger("coordinator.group")

CONSUMER_PROTOCOL_TYPE = "consumer"
_CAN_REBALANCE_FROM = VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]


class GroupMetadata:
    __slots__ = (  # one object less per group, and no per-group dict for the collector to walk
        "group_id", "state", "current_state_timestamp_ms", "observer", "protocol_type", "protocol_name",
        "generation_id", "leader_id", "members", "static_members", "pending_members", "pending_sync_members",
        "num_members_awaiting_join", "supported_protocols", "new_member_added", "subscribed_topics",
        "rebalance_started_ms", "offsets", "offset_versions", "pending_offset_commits", "possibly_written",
        "replacement_holds", "offsets_moved_to",
    )

    def __init__(self, group_id: str, state: GroupState, now_ms: int, observer: GroupObserver) -> None:
        self.group_id = group_id
        self.state = state
        self.current_state_timestamp_ms: int | None = now_ms
        self.observer = observer
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, MemberMetadata] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_members: set[str] = set()  # KIP-394 ids handed out, not yet joined
        self.pending_sync_members: set[str] = set()
        self.num_members_awaiting_join = 0
        self.supported_protocols: Counter[str] = Counter()
        self.new_member_added = False  # InitialDelayedJoin extension flag
        self.subscribed_topics: set[str] | None = None
        self.rebalance_started_ms: int | None = None
        self.offsets: dict[TopicPartition, OffsetRecord] = {}
        self.offset_versions: dict[TopicPartition, int] = {}  # sequence of the write that set the cached offset
        self.pending_offset_commits: Counter[TopicPartition] = Counter()
        # partitions whose latest failed commit may be in the log all the same (a failure after the append, a
        # timeout, the producer's retries): never served, but tombstoned by any deletion; the failed write's sequence
        self.possibly_written: dict[TopicPartition, int] = {}
        # static replacements whose write is not decided yet, while any is (coordinator/group/replacement_hold.py)
        self.replacement_holds: list[ReplacementHold] | None = None
        # the object that holds this group's offsets since the group id changed type (an online upgrade or
        # downgrade): commits in flight then are finished there (hand_offsets_to)
        self.offsets_moved_to: GroupMetadata | None = None

    # --- state -----------------------------------------------------------------------------------------------
    def is_in(self, state: GroupState) -> bool:
        return self.state is state

    @property
    def can_rebalance(self) -> bool:
        return self.state in _CAN_REBALANCE_FROM

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS[target]:
            raise IllegalStateTransition(self.group_id, self.state, target)
        old, self.state = self.state, target
        self.current_state_timestamp_ms = now_ms
        log.debug("event=state_change group=%s from=%s to=%s generation=%d",
                  self.group_id, old.value, target.value, self.generation_id)
        self.observer.on_state_change(self.group_id, old.value, target.value, self.generation_id)

    # --- membership ------------------------------------------------------------------------------------------
    def get(self, member_id: str) -> MemberMetadata:
        return self.members[member_id]

    @property
    def size(self) -> int:
        return len(self.members)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def current_static_member_id(self, group_instance_id: str | None) -> str | None:
        return None if group_instance_id is None else self.static_members.get(group_instance_id)

    def add(self, member: MemberMetadata, join_future: asyncio.Future[JoinGroupResponse] | None = None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise RuntimeError(f"Static member with groupInstanceId={member.group_instance_id} "
                                   f"cannot be added to group {self.group_id} since it is already a member")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self._count_protocols(member.supported_protocols, +1)
        member.join_future = join_future
        if join_future is not None:
            self.num_members_awaiting_join += 1
            if self.observer.waits_watched:
                self.observer.on_join_waiting(self.group_id, member.member_id)
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self._count_protocols(member.supported_protocols, -1)
            if member.is_awaiting_join:
                self.num_members_awaiting_join -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)

    def update_member(self, member: MemberMetadata, protocols: Protocols, rebalance_timeout_ms: int,
                      session_timeout_ms: int, join_future: asyncio.Future[JoinGroupResponse] | None
                      ) -> asyncio.Future[JoinGroupResponse] | None:
        """Returns the join future this one supersedes (to be answered by the caller), if any."""
        old = member.supported_protocols
        if not (len(old) == 1 and len(protocols) == 1 and old[0][0] == protocols[0][0]):  # else: the same counts
            self._count_protocols(old, -1)
            self._count_protocols(protocols, +1)
        member.supported_protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        superseded = member.join_future
        if join_future is not None and superseded is None:
            self.num_members_awaiting_join += 1
        elif join_future is None and superseded is not None:
            self.num_members_awaiting_join -= 1
        member.join_future = join_future
        if join_future is not None and self.observer.waits_watched:  # (a call per member: skipped when unwatched)
            self.observer.on_join_waiting(self.group_id, member.member_id)
        return superseded if join_future is not None else None

    def replace_static_member(self, group_instance_id: str, old_member_id: str, new_member_id: str
                              ) -> MemberMetadata:
        """Moves the member to its new id; the caller fences whatever the old id had parked first."""
        member = self.members.pop(old_member_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        return member

    def complete_join(self, member: MemberMetadata, response: JoinGroupResponse) -> bool:
        """Answers the member's parked JoinGroup, if any (Kafka's maybeInvokeJoinCallback)."""
        future = member.join_future
        if future is None:
            return False
        member.join_future = None
        self.num_members_awaiting_join -= 1
        if not future.done():
            answer_parked(future, response)
        return True

    def complete_sync(self, member: MemberMetadata, response: SyncGroupResponse) -> bool:
        future = member.sync_future
        if future is None:
            return False
        member.sync_future = None
        if not future.done():
            answer_parked(future, response)
        return True

    @property
    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_members_awaiting_join and not self.pending_members

    def not_yet_rejoined_members(self) -> list[MemberMetadata]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keeps a leader that re-joined, else picks any member that did; False if nobody re-joined."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.is_awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.is_awaiting_join:
                log.info("event=leader_reelected group=%s old_leader=%s new_leader=%s reason=%s",
                         self.group_id, self.leader_id, member_id, "leader failed to join before rebalance timeout")
                self.leader_id = member_id
                return True
        log.info("event=no_member_rejoined group=%s leader=%s", self.group_id, self.leader_id)
        return False

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # --- protocols -------------------------------------------------------------------------------------------
    def _count_protocols(self, protocols: Protocols, delta: int) -> None:
        # Counts members, not list entries: a name listed twice by one member must not look unsupported by
        # the others (Kafka counts entries, and its protocol vote then throws and wedges the group).
        if len(protocols) == 1:  # the usual case
            self.supported_protocols[protocols[0][0]] += delta
            return
        for name in {name for name, _ in protocols}:
            self.supported_protocols[name] += delta

    def candidate_protocols(self) -> set[str]:
        size = len(self.members)
        return {name for name, count in self.supported_protocols.items() if count == size}

    def supports_protocols(self, protocol_type: str, protocols: Protocols) -> bool:
        """Whether a joining member with these protocols fits: one of them supported by every member (a loop, not
        a set and a generator: every member of a rebalance asks)."""
        if self.state is EMPTY:  # the module's name: an Enum class attribute costs ten times a global's
            return bool(protocol_type) and bool(protocols)
        if self.protocol_type != protocol_type:
            return False
        size = len(self.members)
        counts = self.supported_protocols
        for name, _ in protocols:
            if counts.get(name, 0) == size:
                return True
        return False

    def select_protocol(self) -> str:
        """Each member votes for its first candidate; most votes wins (ties: the first protocol voted for)."""
        if not self.members:
            raise RuntimeError(f"Cannot select protocol for empty group {self.group_id}")
        candidates = self.candidate_protocols()
        if len(candidates) == 1:  # every member supports it (that makes it a candidate), so every vote is for it
            return next(iter(candidates))
        votes = Counter(member.vote(candidates) for member in self.members.values())
        return votes.most_common(1)[0][0]

    def current_member_metadata(self) -> list[JoinGroupResponseMember]:
        """The leader's JoinGroup member list: every member with its metadata for the selected protocol."""
        protocol = self.protocol_name
        if protocol is None:
            raise RuntimeError(f"No protocol selected for group {self.group_id}")
        return [JoinGroupResponseMember(m.member_id, m.group_instance_id, _metadata(m, protocol))
                for m in self.members.values()]

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self._compute_subscribed_topics()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self._compute_subscribed_topics()
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def _compute_subscribed_topics(self) -> set[str] | None:
        """Topics the consumer-protocol members subscribe to; None when unknown (then no offset expires while
        the group is Stable, as in Kafka)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:  # members but no protocol (an odd record): unknown, as in Kafka
            return None
        topics: set[str] = set()
        protocol = self.protocol_name
        seen: set[bytes] = set()  # members with the same subscription bytes (often all of them) parsed once
        for member in self.members.values():
            metadata = _metadata(member, protocol)
            if type(metadata) is bytes:
                if metadata in seen:
                    continue
                seen.add(metadata)
            parsed = parse_subscription_topics(metadata)
            if parsed is None:
                return None
            topics.update(parsed)
        return topics

    # --- offsets ---------------------------------------------------------------------------------------------
    @property
    def has_offsets(self) -> bool:
        return bool(self.offsets) or bool(self.pending_offset_commits)

    def has_pending_offset_commit(self, tp: TopicPartition) -> bool:
        return self.pending_offset_commits.get(tp, 0) > 0

    def prepare_offset_commit(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.pending_offset_commits[tp] += 1

    def hand_offsets_to(self, other: GroupMetadata) -> None:
        """The group id changed type and `other` holds its offsets from now on: the cached offsets, the commits in
        flight and those that may have landed, as Kafka's stay where they are (its offsets live apart from the
        group, keyed by group id). A commit in flight finishes on `other` (offsets_holder)."""
        other.offsets = dict(self.offsets)
        other.offset_versions = dict(self.offset_versions)
        other.pending_offset_commits = Counter(self.pending_offset_commits)
        other.possibly_written = dict(self.possibly_written)
        other.offsets_moved_to = None
        self.offsets_moved_to = other

    def offsets_holder(self) -> GroupMetadata:
        """This group's offsets' holder now: itself, or the object a conversion handed them to."""
        holder = self
        while holder.offsets_moved_to is not None:
            holder = holder.offsets_moved_to
        return holder

    def finish_offset_commit(self, offsets: dict[TopicPartition, OffsetRecord], version: int, ok: bool) -> None:
        for tp, record in offsets.items():
            pending = self.pending_offset_commits.get(tp, 0)
            if pending <= 0:
                continue  # removed meanwhile (deleted): its tombstone was queued after this write
            if pending == 1:
                del self.pending_offset_commits[tp]
            else:
                self.pending_offset_commits[tp] = pending - 1
            if not ok:
                self.possibly_written[tp] = max(version, self.possibly_written.get(tp, -1))
                continue
            if self.possibly_written.get(tp, version) < version:  # written after the failed one: later in the log
                del self.possibly_written[tp]
            if self._is_newer(tp, record, version):
                self.offsets[tp] = record
                self.offset_versions[tp] = version

    def _is_newer(self, tp: TopicPartition, record: OffsetRecord, version: int) -> bool:
        """Later in the log than the cached offset when both records' offsets are known (a client's committed
        transactional offset has its record's; our writes have theirs once acknowledged), else a later write."""
        current = self.offsets.get(tp)
        if current is not None and current.log_offset is not None and record.log_offset is not None:
            return record.log_offset > current.log_offset
        return version > self.offset_versions.get(tp, -1)

    def remove_offsets(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Drops the offsets, any commit of them in flight and any that may have landed; returns the partitions
        the log may hold a record of, each to be tombstoned: cached, in flight (queued before the tombstone, so
        stored before it if at all) or possibly written."""
        removed = [tp for tp in partitions
                   if tp in self.offsets or tp in self.pending_offset_commits or tp in self.possibly_written]
        for tp in partitions:
            self.offsets.pop(tp, None)
            self.offset_versions.pop(tp, None)
            self.pending_offset_commits.pop(tp, None)
            self.possibly_written.pop(tp, None)
        return removed

    def partitions_in_log(self) -> list[TopicPartition]:
        """Every partition the log may hold an offset of: cached, in flight or possibly written."""
        return list(dict.fromkeys([*self.offsets, *self.pending_offset_commits, *self.possibly_written]))

    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """Offsets due for expiry (Kafka 3.9 `removeExpiredOffsets`, without removing them)."""
        if self.protocol_type is not None and self.is_in(GroupState.EMPTY):
            base_ms = self.current_state_timestamp_ms
            return self._expired(now_ms, retention_ms, set(), lambda r: r.commit_timestamp_ms if base_ms is None
                                 else base_ms)
        if (self.protocol_type == CONSUMER_PROTOCOL_TYPE and self.subscribed_topics is not None
                and self.is_in(GroupState.STABLE)):
            return self._expired(now_ms, retention_ms, self.subscribed_topics, lambda r: r.commit_timestamp_ms)
        if self.protocol_type is None:
            return self._expired(now_ms, retention_ms, set(), lambda r: r.commit_timestamp_ms)
        return []

    def expired_unsubscribed_offsets(self, now_ms: int, retention_ms: int, subscribed: set[str]
                                     ) -> list[TopicPartition]:
        """Offsets of topics not in `subscribed` due for expiry by their commit time (a KIP-848 consumer group's
        offsets, kept here: ConsumerGroup.offsetExpirationCondition)."""
        return self._expired(now_ms, retention_ms, subscribed, lambda r: r.commit_timestamp_ms)

    def _expired(self, now_ms: int, retention_ms: int, subscribed: set[str],
                 base: Callable[[OffsetRecord], int]) -> list[TopicPartition]:
        expired = []
        for tp, record in self.offsets.items():
            if tp[0] in subscribed or self.has_pending_offset_commit(tp):
                continue
            if record.expire_timestamp_ms is None:
                if now_ms - base(record) >= retention_ms:
                    expired.append(tp)
            elif now_ms >= record.expire_timestamp_ms:
                expired.append(tp)
        return expired

    # --- persistence -----------------------------------------------------------------------------------------
    def to_record(self, assignment: dict[str, bytes]) -> GroupRecord:
        """GroupMetadataValue v3 for the current generation with the given assignment."""
        protocol = self.protocol_name
        # positional, in MemberRecord's field order (a keyword call costs twice as much: one per member and write)
        members = [
            MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                         m.session_timeout_ms, _metadata(m, protocol) if protocol is not None else b"",
                         assignment.get(m.member_id, b""))
            for m in self.members.values()
        ]
        return GroupRecord(
            protocol_type=self.protocol_type or "", generation=self.generation_id, protocol=protocol,
            leader=self.leader_id, current_state_timestamp_ms=(
                -1 if self.current_state_timestamp_ms is None else self.current_state_timestamp_ms),
            members=members,
        )

    def __repr__(self) -> str:
        return (f"GroupMetadata(group_id={self.group_id}, state={self.state.value}, "
                f"generation={self.generation_id}, members={list(self.members)})")


def _metadata(member: MemberMetadata, protocol: str) -> bytes:
    """`member.metadata(protocol)`, without the call for a member of one protocol (the usual member)."""
    protocols = member.supported_protocols
    if len(protocols) == 1 and protocols[0][0] == protocol:
        return protocols[0][1]
    return member.metadata(protocol)


def parse_subscription_topics(metadata: bytes) -> list[str] | None:
    """Topics of a ConsumerProtocolSubscription, read as v0 (the prefix of every version: version int16, topics
    [string], user data nullable bytes); None if that does not parse (Kafka's SchemaException case)."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        if count < 0:
            return None
        offset, topics = 6, []
        for _ in range(count):
            (length,) = struct.unpack_from(">h", metadata, offset)
            offset += 2
            if length < 0 or offset + length > len(metadata):
                return None
            topics.append(metadata[offset:offset + length].decode("utf-8", "replace"))
            offset += length
        (user_data_length,) = struct.unpack_from(">i", metadata, offset)
        if user_data_length < -1 or offset + 4 + max(user_data_length, 0) > len(metadata):
            return None
        return topics
    except struct.error:
        return None
