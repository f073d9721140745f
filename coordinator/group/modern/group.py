"""A consumer group of the KIP-848 protocol (Kafka's ConsumerGroup): group epoch, target assignment and its
epoch, members, and which member holds which partition at which epoch.

State changes only by `replay(record)`: heartbeats and timers compute records, the shard replays them, and a
load replays the same records from the state topic.

States (derived, never set):
  Empty        no members.
  Assigning    the group epoch is ahead of the assignment epoch: the next heartbeat computes the target.
  Reconciling  some member is not STABLE at the assignment epoch.
  Stable       every member has its target at the assignment epoch.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Collection
from typing import ClassVar

from coordinator.group.assignor.spec import OrderedAssignment, ordered
from coordinator.group.modern.member import LEAVE_GROUP_MEMBER_EPOCH, ConsumerGroupMember
from coordinator.group.modern.records import (ConsumerGroupRecord, CurrentAssignmentRecord, GroupEpochRecord,
                                              MemberMetadataRecord, Partitions, RecordType, RegexRecord,
                                              TargetAssignmentEpochRecord, TargetAssignmentRecord, Tombstone)


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class ConsumerGroup:
    protocol_type: ClassVar[str] = "consumer"  # read on the class too (admin.py's ListGroups)

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.metadata_hash = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerGroupMember] = {}
        self.static_members: dict[str, str] = {}  # instance id -> member id
        self.targets: dict[str, Partitions] = {}  # member id -> target
        # member id -> (its target, that target in Kafka's iteration order): `ordered_target`
        self._ordered_targets: dict[str, tuple[Partitions, OrderedAssignment]] = {}
        # partition -> (epoch, member id) of the member holding it (assigned or revoking)
        self._partition_epochs: dict[tuple[uuid.UUID, int], tuple[int, str]] = {}
        self._subscriptions: Counter[str] = Counter()  # topic name -> members subscribed to it by name
        self._regex_subscribers: Counter[str] = Counter()  # regular expression -> members subscribed to it
        self.resolved_regexes: dict[str, RegexRecord] = {}  # regular expression -> what it resolved to
        self.deleted = False  # its metadata record was tombstoned
        self.metadata_refresh_deadline_ms = 0  # when the subscribed topics are looked at again (not persisted)

    def snapshot(self) -> ConsumerGroup:
        """A copy to go back to if the records about to be replayed are not written (Kafka reverts its timeline
        to the last committed offset). Members and partitions are immutable: shallow copies of the maps do."""
        # made, not copied with copy.copy: a compiled class's copy calls its __init__ without arguments
        clone = ConsumerGroup(self.group_id)
        clone.group_epoch, clone.metadata_hash, clone.assignment_epoch = (self.group_epoch, self.metadata_hash,
                                                                          self.assignment_epoch)
        clone.deleted, clone.metadata_refresh_deadline_ms = self.deleted, self.metadata_refresh_deadline_ms
        clone.members, clone.static_members, clone.targets = (dict(self.members), dict(self.static_members),
                                                              dict(self.targets))
        clone._ordered_targets, clone._partition_epochs = dict(self._ordered_targets), dict(self._partition_epochs)
        clone.resolved_regexes = dict(self.resolved_regexes)
        clone._subscriptions, clone._regex_subscribers = self._subscriptions.copy(), self._regex_subscribers.copy()
        return clone

    def undo_point(self) -> GroupUndo:
        """What to go back to if the records about to be replayed are not written, costing what they touch
        (`GroupUndo.capture` before each replay) rather than the group's size, as `snapshot` does."""
        return GroupUndo(self)

    # --- derived state --------------------------------------------------------------------------------------
    @property
    def state(self) -> ConsumerGroupState:
        if self.deleted:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(not m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        held = self._partition_epochs.get((topic_id, partition))
        return -1 if held is None else held[0]

    def target_of(self, member_id: str) -> Partitions:
        return self.targets.get(member_id, {})

    def ordered_target(self, member_id: str, target: Partitions) -> OrderedAssignment:
        """`target` in Kafka's iteration order (assignor/spec.py `ordered`: what an assignor is given as the
        member's current target). Kept while `target` is the member's target (the same object: a replayed record
        makes a new one), so a target computation of a large group orders only the targets that changed since the
        last, not every member's again (a Java hash order per member: a quarter of a 1,000-member computation)."""
        kept = self._ordered_targets.get(member_id)
        if kept is not None and kept[0] is target:
            return kept[1]
        result = ordered(target)
        if self.targets.get(member_id) is target:
            self._ordered_targets[member_id] = (target, result)
        return result

    def static_member(self, instance_id: str) -> ConsumerGroupMember | None:
        member_id = self.static_members.get(instance_id)
        return None if member_id is None else self.members.get(member_id)

    def members_with(self, replacing: ConsumerGroupMember | None = None,
                     removing: str | None = None) -> dict[str, ConsumerGroupMember]:
        """The members as they will be: `replacing` in place of its old self (or added), without `removing`."""
        members = {member_id: m for member_id, m in self.members.items() if member_id != removing}
        if replacing is not None:
            members[replacing.member_id] = replacing
        return members

    def subscribed_topic_names(self, replacing: ConsumerGroupMember | None = None,
                               removing: str | None = None,
                               resolved: dict[str, tuple[str, ...]] | None = None) -> Counter[str]:
        """Topic name -> subscriptions to it, by name or through a resolved regular expression (see members_with;
        `resolved` overrides resolutions). Kept up to date by replay: this costs the number of topics and regular
        expressions, not of members."""
        counts = self._subscriptions.copy()
        regexes = self.subscribed_regexes(replacing, removing)
        for member_id in {removing, replacing.member_id if replacing is not None else None} - {None}:
            old = self.members.get(member_id)  # type: ignore[arg-type]
            if old is not None:
                counts.subtract(old.subscribed_topic_names)
        if replacing is not None:
            counts.update(replacing.subscribed_topic_names)
        for regex, subscribers in regexes.items():
            for topic in self._resolution(regex, resolved):
                counts[topic] += subscribers
        return +counts  # drops topics nobody subscribes to any more

    def topic_names(self) -> Collection[str]:
        """The names `subscribed_topic_names()` counts, as the group stands; without a copy when no member
        subscribes by regular expression (the counts are kept positive)."""
        if not self._regex_subscribers:
            return self._subscriptions.keys()
        return self.subscribed_topic_names().keys()

    def has_regex_subscribers(self) -> bool:
        return bool(self._regex_subscribers)  # counts are kept positive (_count_subscriptions)

    def subscribed_regexes(self, replacing: ConsumerGroupMember | None = None,
                           removing: str | None = None) -> Counter[str]:
        """Regular expression -> members subscribed to it (see members_with)."""
        counts = self._regex_subscribers.copy()
        for member_id in {removing, replacing.member_id if replacing is not None else None} - {None}:
            old = self.members.get(member_id)  # type: ignore[arg-type]
            if old is not None and old.subscribed_topic_regex:
                counts[old.subscribed_topic_regex] -= 1
        if replacing is not None and replacing.subscribed_topic_regex:
            counts[replacing.subscribed_topic_regex] += 1
        return +counts

    def effective_topics(self, member: ConsumerGroupMember) -> frozenset[str]:
        """The topics a member subscribes to: by name, and through its regular expression once resolved."""
        regex = member.subscribed_topic_regex
        if not regex:
            return frozenset(member.subscribed_topic_names)
        return frozenset(member.subscribed_topic_names) | frozenset(self._resolution(regex, None))

    def _resolution(self, regex: str, resolved: dict[str, tuple[str, ...]] | None) -> tuple[str, ...]:
        if resolved is not None and regex in resolved:
            return resolved[regex]
        record = self.resolved_regexes.get(regex)
        return () if record is None else record.topics

    @property
    def last_regex_refresh_ms(self) -> int | None:
        return max((r.timestamp_ms for r in self.resolved_regexes.values()), default=None)

    @property
    def last_regex_version(self) -> int:
        return min((r.version for r in self.resolved_regexes.values()), default=-1)

    def preferred_assignor(self, replacing: ConsumerGroupMember | None = None,
                           removing: str | None = None) -> str | None:
        """The most common ServerAssignor among the members (see members_with; Kafka's
        computePreferredServerAssignor); None if no member names one."""
        members = self.members_with(replacing, removing)
        counts = Counter(m.server_assignor for m in members.values() if m.server_assignor is not None)
        return counts.most_common(1)[0][0] if counts else None

    # --- replay -----------------------------------------------------------------------------------------------
    def replay(self, record: ConsumerGroupRecord) -> None:
        if isinstance(record, Tombstone):
            self._replay_tombstone(record)
        elif isinstance(record, GroupEpochRecord):
            self.group_epoch, self.metadata_hash, self.deleted = record.epoch, record.metadata_hash, False
        elif isinstance(record, MemberMetadataRecord):
            member = self.members.get(record.member_id) or ConsumerGroupMember(record.member_id)
            self._put_member(member.with_metadata(record))
        elif isinstance(record, TargetAssignmentEpochRecord):
            self.assignment_epoch = record.assignment_epoch
        elif isinstance(record, TargetAssignmentRecord):
            self.targets[record.member_id] = dict(record.partitions)
        elif isinstance(record, CurrentAssignmentRecord):
            member = self.members.get(record.member_id) or ConsumerGroupMember(record.member_id)
            self._put_member(member.with_assignment(record))
        elif isinstance(record, RegexRecord):
            self.resolved_regexes[record.regex] = record

    def _replay_tombstone(self, record: Tombstone) -> None:
        member_id = record.member_id or ""
        if record.record_type is RecordType.GROUP_METADATA:
            self.deleted = True
        elif record.record_type is RecordType.REGULAR_EXPRESSION:
            self.resolved_regexes.pop(record.regex or "", None)
        elif record.record_type is RecordType.MEMBER_METADATA:
            old = self.members.pop(member_id, None)
            if old is not None:
                self._remove_partition_epochs(old)
                self._count_subscriptions(old, -1)
                if old.instance_id is not None and self.static_members.get(old.instance_id) == member_id:
                    del self.static_members[old.instance_id]
        elif record.record_type is RecordType.TARGET_ASSIGNMENT_MEMBER:
            self.targets.pop(member_id, None)
            self._ordered_targets.pop(member_id, None)
        elif record.record_type is RecordType.CURRENT_MEMBER_ASSIGNMENT:
            old = self.members.get(member_id)
            if old is not None:
                self._put_member(old.replace(member_epoch=LEAVE_GROUP_MEMBER_EPOCH, previous_member_epoch=-1,
                                             assigned={}, pending_revocation={}))

    def _put_member(self, member: ConsumerGroupMember) -> None:
        old = self.members.get(member.member_id)
        if old is not None:
            self._remove_partition_epochs(old)
            if old.instance_id is not None and old.instance_id != member.instance_id:
                self.static_members.pop(old.instance_id, None)
        if old is None or (old.subscribed_topic_names, old.subscribed_topic_regex) != (
                member.subscribed_topic_names, member.subscribed_topic_regex):
            if old is not None:
                self._count_subscriptions(old, -1)
            self._count_subscriptions(member, 1)
        self.members[member.member_id] = member
        if member.instance_id is not None and (old is None or old.instance_id != member.instance_id):
            # a member's instance id goes to it when it comes or takes that id, not with each of its records: a
            # loaded member that a later member of its id replaced (a write lost in between) does not take it back
            # (ConsumerGroupService._fence_written_over fences it)
            self.static_members[member.instance_id] = member.member_id
        self._add_partition_epochs(member)

    def _restore_members(self, earlier: dict[str, ConsumerGroupMember | None]) -> None:
        """These members back as they were (None: absent). Every one's partitions are released first: a partition
        one of them released may be another's now."""
        current = [(member_id, self.members.get(member_id)) for member_id in earlier]
        for _, member in current:
            if member is not None:
                self._remove_partition_epochs(member)
        for member_id, member in current:
            if member is not None:
                del self.members[member_id]
                self._count_subscriptions(member, -1)
                if member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
                    del self.static_members[member.instance_id]
        for member in earlier.values():
            if member is not None:
                self._put_member(member)

    def _count_subscriptions(self, member: ConsumerGroupMember, sign: int) -> None:
        for name in member.subscribed_topic_names:
            self._subscriptions[name] += sign
        if member.subscribed_topic_regex:
            self._regex_subscribers[member.subscribed_topic_regex] += sign
        self._subscriptions, self._regex_subscribers = +self._subscriptions, +self._regex_subscribers

    def index_partition_epochs(self) -> None:
        """Every member's partitions (assigned or revoking) with its epoch again, from scratch."""
        self._partition_epochs.clear()
        for member in self.members.values():
            self._add_partition_epochs(member)

    def _add_partition_epochs(self, member: ConsumerGroupMember) -> None:
        for partitions in (member.assigned, member.pending_revocation):
            for topic_id, ps in partitions.items():
                for p in ps:
                    self._partition_epochs[(topic_id, p)] = (member.member_epoch, member.member_id)

    def _remove_partition_epochs(self, member: ConsumerGroupMember) -> None:
        for partitions in (member.assigned, member.pending_revocation):
            for topic_id, ps in partitions.items():
                for p in ps:
                    # only its own entry: another member of the same epoch may hold the partition now (a load
                    # replays a member's records after another's that held it; seed 2250 of --protocol upgrade)
                    if self._partition_epochs.get((topic_id, p)) == (member.member_epoch, member.member_id):
                        del self._partition_epochs[(topic_id, p)]


class GroupUndo:
    """A consumer group's state before some records were replayed onto it: its epochs and metadata hash, and the
    earlier value of each member, target and resolved regular expression those records touch (captured before
    they are replayed). `restore` puts them back; `members` is what observers read of the group before (the
    touched members that existed)."""

    __slots__ = ("group", "group_epoch", "metadata_hash", "assignment_epoch", "deleted", "_members", "_targets",
                 "_regexes")

    def __init__(self, group: ConsumerGroup) -> None:
        self.group = group
        self.group_epoch, self.metadata_hash = group.group_epoch, group.metadata_hash
        self.assignment_epoch, self.deleted = group.assignment_epoch, group.deleted
        self._members: dict[str, ConsumerGroupMember | None] = {}
        self._targets: dict[str, Partitions | None] = {}
        self._regexes: dict[str, RegexRecord | None] = {}

    def capture(self, records: Collection[ConsumerGroupRecord]) -> None:
        """The earlier values of what `records` overwrite (only the first capture of a key counts)."""
        group = self.group
        for record in records:
            member_id = getattr(record, "member_id", None)
            if member_id is not None:
                self.capture_member(member_id)
            regex = getattr(record, "regex", None)
            if regex is not None and regex not in self._regexes:
                self._regexes[regex] = group.resolved_regexes.get(regex)

    def capture_member(self, member_id: str) -> None:
        """The member's earlier value and target."""
        if member_id not in self._members:
            self._members[member_id] = self.group.members.get(member_id)
        if member_id not in self._targets:
            self._targets[member_id] = self.group.targets.get(member_id)

    def capture_targets(self) -> None:
        """Every member's target (before a target computation)."""
        for member_id, target in self.group.targets.items():
            self._targets.setdefault(member_id, target)

    @property
    def members(self) -> dict[str, ConsumerGroupMember]:
        return {member_id: m for member_id, m in self._members.items() if m is not None}

    def restore(self) -> ConsumerGroup:
        """The group as it was at the undo point (provided nothing replayed since was captured); returns it."""
        group = self.group
        group.group_epoch, group.metadata_hash = self.group_epoch, self.metadata_hash
        group.assignment_epoch, group.deleted = self.assignment_epoch, self.deleted
        for member_id, target in self._targets.items():
            if target is None:
                group.targets.pop(member_id, None)
            else:
                group.targets[member_id] = target
        for regex, resolved in self._regexes.items():
            if resolved is None:
                group.resolved_regexes.pop(regex, None)
            else:
                group.resolved_regexes[regex] = resolved
        group._restore_members(self._members)
        return group
