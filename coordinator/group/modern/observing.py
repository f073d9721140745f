"""What a consumer group's change tells the observers (event topic, tracing, metrics).

Group logic computes records and the service replays them; this reads the change off the group before and after
and the records themselves, so the pure functions of heartbeat.py and classic.py know nothing of observers. In
the order a reader wants them: the members that joined, were replaced, left or were fenced (the cause), the
group epoch bump (a rebalance starts; one under way is superseded), the target computed, each member's move
towards it, and the rebalance's end once every member has reached the target epoch (or none is left).

Cost: nothing for a heartbeat that changes nothing (no records, no call). A change costs its records; a target
computation costs one pass over the members (as the assignor's own), to know whom the rebalance waits for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial

from coordinator.group.modern.group import ConsumerGroup, GroupUndo
from coordinator.group.modern.member import LEAVE_GROUP_STATIC_MEMBER_EPOCH, ConsumerGroupMember, MemberState
from coordinator.group.modern.records import (ConsumerGroupRecord, CurrentAssignmentRecord, GroupEpochRecord,
                                              MemberMetadataRecord, RecordType, RegexRecord,
                                              TargetAssignmentEpochRecord, TargetAssignmentRecord, Tombstone)
from coordinator.group.observer import (ASSIGNED, EPOCH_REACHED, REVOCATION_REQUESTED, REVOKED,
                                        WAITING_FOR_PARTITIONS, ConsumerRebalance, GroupObserver, RebalanceCategory,
                                        RebalanceCause, Reconciliation)


@dataclass(frozen=True, slots=True)
class Fenced:
    """Why the members this change removes are gone when a timer fenced them: the end of Kafka's line
    ("Member X fenced from the group because <because>") and its category."""

    because: str
    category: RebalanceCategory

    def line(self, member_id: str) -> str:
        return f"Member {member_id} fenced from the group because {self.because}"


@dataclass(slots=True)
class _UnderWay:
    group_epoch: int
    started_ms: int | None  # None: resumed after a load, its start unknown here
    waiting: set[str] | None = None  # members not at the target epoch yet, once the target is computed


@dataclass(slots=True)
class _Change:
    """The records of one change, sorted by what they say."""

    removed: list[str]
    written: list[MemberMetadataRecord]
    assignments: list[str]
    bump: GroupEpochRecord | None
    target_epoch: int | None
    changed_targets: int
    regexes: list[str]

    @classmethod
    def of(cls, records: Sequence[ConsumerGroupRecord]) -> _Change:
        change = cls([], [], [], None, None, 0, [])
        for record in records:
            if isinstance(record, Tombstone):
                if record.record_type is RecordType.MEMBER_METADATA and record.member_id:
                    change.removed.append(record.member_id)
            elif isinstance(record, MemberMetadataRecord):
                change.written.append(record)
            elif isinstance(record, CurrentAssignmentRecord):
                change.assignments.append(record.member_id)
            elif isinstance(record, GroupEpochRecord):
                change.bump = record
            elif isinstance(record, TargetAssignmentEpochRecord):
                change.target_epoch = record.assignment_epoch
            elif isinstance(record, TargetAssignmentRecord):
                change.changed_targets += 1
            elif isinstance(record, RegexRecord):
                change.regexes.append(record.regex)
        return change


class ConsumerGroupWatch:
    """Each consumer group's rebalance under way (its start, whom it waits for), on the event loop."""

    def __init__(self, now_ms: Callable[[], int], *, default_assignor: str = "uniform") -> None:
        self._now_ms = now_ms
        self._default_assignor = default_assignor  # the assignor of a group whose members name none
        self._under_way: dict[str, _UnderWay] = {}

    def changed(self, observer: GroupObserver, group_id: str, before: GroupUndo | None,
                after: ConsumerGroup | None, records: Sequence[ConsumerGroupRecord], *,
                fenced: Fenced | None = None, already_members: Collection[str] = (),
                carried_over: Collection[str] | None = None) -> None:
        """`before`/`after`: the group around the replay of `records` (None: no such group); `fenced`: why the
        removed members went, when a timer fenced them; `already_members`: members an upgrade brings along
        (they joined the classic group, not this one); `carried_over`: set when these records convert the group
        to a classic group, the members that group keeps (they are not leaving)."""
        change = _Change.of(records)
        old = before.members if before is not None else {}
        new = after.members if after is not None else {}
        cause, announce = _members(observer, group_id, change, old, new, fenced, already_members,
                                   carried_over or ())
        under_way = self._under_way.get(group_id)
        if after is None or after.deleted:
            for event in announce:
                event()
            if carried_over is not None:
                self.converted(observer, group_id)
            elif under_way is not None:
                self.gone(observer, group_id, "the group was deleted")
            return
        bump = change.bump
        previous_epoch = before.group_epoch if before is not None else 0
        if bump is not None and bump.epoch > previous_epoch:
            # announced first: the events of its cause are then the new rebalance's (its trace, its trace id)
            under_way = self._under_way[group_id] = _UnderWay(bump.epoch, self._now_ms())
            observer.on_consumer_rebalance_started(group_id, ConsumerRebalance(
                bump.epoch, previous_epoch, cause or _metadata_cause(change, old, new, before, bump), len(new)))
        for event in announce:
            event()
        if change.target_epoch is not None:
            observer.on_consumer_target_assigned(group_id, change.target_epoch, len(new), change.changed_targets,
                                                 after.preferred_assignor() or self._default_assignor)
            if under_way is not None and under_way.group_epoch == change.target_epoch:
                under_way.waiting = {member_id for member_id, m in new.items()
                                     if not m.is_reconciled_to(change.target_epoch)}
        for member_id in change.assignments:
            member = new.get(member_id)
            if member is not None:
                _reconciled(observer, group_id, old.get(member_id), member, after.assignment_epoch)
        if under_way is not None:
            self._maybe_completed(observer, group_id, under_way, change, new)

    def _maybe_completed(self, observer: GroupObserver, group_id: str, under_way: _UnderWay, change: _Change,
                         members: dict[str, ConsumerGroupMember]) -> None:
        if members and under_way.waiting is None:
            return  # the target is not computed yet
        if under_way.waiting:
            for member_id in (*change.assignments, *change.removed):
                member = members.get(member_id)
                if member is None or member.is_reconciled_to(under_way.group_epoch):
                    under_way.waiting.discard(member_id)
            if under_way.waiting:
                return
        del self._under_way[group_id]
        started = under_way.started_ms
        observer.on_consumer_rebalance_completed(group_id, under_way.group_epoch, len(members),
                                                 None if started is None else max(0, self._now_ms() - started))

    def resumed(self, observer: GroupObserver, group: ConsumerGroup) -> None:
        """A loaded group in the middle of a rebalance: its end is watched from here."""
        if group.group_id in self._under_way or not group.members:
            return
        epoch = group.group_epoch
        waiting = {member_id for member_id, m in group.members.items() if not m.is_reconciled_to(epoch)}
        if group.assignment_epoch == epoch and not waiting:
            return  # Stable
        self._under_way[group.group_id] = _UnderWay(epoch, None, waiting if group.assignment_epoch == epoch
                                                    else None)
        observer.on_consumer_rebalance_resumed(group.group_id, epoch, len(group.members))

    def converted(self, observer: GroupObserver, group_id: str) -> None:
        """The group became a classic group: its rebalance under way, if any, goes on as the classic group's
        (which the conversion starts, with the conversion as its cause)."""
        under_way = self._under_way.pop(group_id, None)
        if under_way is not None:
            observer.on_consumer_rebalance_converted(group_id, under_way.group_epoch)

    def gone(self, observer: GroupObserver, group_id: str, reason: str) -> None:
        """The group left this instance or was deleted: its rebalance, if one is under way, ends unfinished."""
        under_way = self._under_way.pop(group_id, None)
        if under_way is not None:
            observer.on_consumer_rebalance_abandoned(group_id, under_way.group_epoch, reason)


def _members(observer: GroupObserver, group_id: str, change: _Change, old: dict[str, ConsumerGroupMember],
             new: dict[str, ConsumerGroupMember], fenced: Fenced | None, already_members: Collection[str],
             carried_over: Collection[str]) -> tuple[RebalanceCause | None, list[Callable[[], None]]]:
    """The cause the membership changes make, and their events to announce (the replaced or removed first;
    members `carried_over` into a classic group are removed from this one without leaving)."""
    cause: RebalanceCause | None = None
    events: list[Callable[[], None]] = []
    removed = [old[member_id] for member_id in change.removed if member_id in old and member_id not in carried_over]
    arrived = [member for member in (new.get(r.member_id) for r in change.written if r.member_id not in old)
               if member is not None and member.member_id not in already_members]
    successors = {m.instance_id: m for m in arrived if m.instance_id}
    replacing: set[str] = set()
    for member in removed:
        successor = successors.pop(member.instance_id, None) if member.instance_id else None
        if successor is not None:
            replacing.add(successor.member_id)
            events.append(partial(observer.on_consumer_member_replaced, group_id, member.member_id,
                                  successor.member_id, member.instance_id or ""))
            cause = cause or RebalanceCause(
                RebalanceCategory.STATIC_MEMBER,
                f"Static member with instance id {member.instance_id} re-joins the consumer group using the "
                f"{_protocol(successor)} protocol. Created a new member {successor.member_id} to replace the "
                f"existing member {member.member_id}.", successor.member_id)
        elif fenced is not None:
            line = fenced.line(member.member_id)
            events.append(partial(observer.on_consumer_member_failed, group_id, member.member_id, member.instance_id,
                                  line, fenced.category))
            cause = cause or RebalanceCause(fenced.category, line, member.member_id)
        else:
            line = _left_line(member)
            events.append(partial(observer.on_consumer_member_left, group_id, member.member_id, member.instance_id,
                                  line))
            cause = cause or RebalanceCause(RebalanceCategory.MEMBER_LEFT, line, member.member_id)
    for member in arrived:
        if member.member_id in replacing:
            continue
        events.append(partial(observer.on_consumer_member_joined, group_id, member.member_id, member.instance_id,
                              member.client_id, member.client_host, _protocol(member)))
        cause = cause or RebalanceCause(
            RebalanceCategory.MEMBER_JOINED,
            f"Member {member.member_id} joins the consumer group using the {_protocol(member)} protocol.",
            member.member_id)
    for member_id in change.assignments:  # a static member's epoch -2: gone for now, back within its session
        leaving, was = new.get(member_id), old.get(member_id)
        if (leaving is not None and was is not None and leaving.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH
                and was.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            events.append(partial(
                observer.on_consumer_member_left, group_id, member_id, leaving.instance_id,
                f"Static member {member_id} with instance id {leaving.instance_id} temporarily left the consumer "
                "group."))
    return cause, events


def _protocol(member: ConsumerGroupMember) -> str:
    return "classic" if member.uses_classic_protocol else "consumer"


def _left_line(member: ConsumerGroupMember) -> str:
    """Kafka 4.1's line for a member leaving (ConsumerGroupHeartbeat -1, or LeaveGroup for a classic member)."""
    if member.instance_id is None:
        return f"Member {member.member_id} left the consumer group."
    return f"Static member {member.member_id} with instance id {member.instance_id} left the consumer group."


def _metadata_cause(change: _Change, old: dict[str, ConsumerGroupMember], new: dict[str, ConsumerGroupMember],
                    before: GroupUndo | None, bump: GroupEpochRecord) -> RebalanceCause:
    """A bump no member joined, left or was fenced for: a subscription, a regular expression or the topics."""
    for record in change.written:
        was, member = old.get(record.member_id), new.get(record.member_id)
        if was is None or member is None:
            continue
        if member.subscribed_topic_names != was.subscribed_topic_names:
            return RebalanceCause(RebalanceCategory.SUBSCRIPTION_CHANGED,
                                  f"Member {member.member_id} updated its subscribed topics to: "
                                  f"[{', '.join(member.subscribed_topic_names)}].", member.member_id)
        if member.subscribed_topic_regex != was.subscribed_topic_regex:
            return RebalanceCause(RebalanceCategory.SUBSCRIPTION_CHANGED,
                                  f"Member {member.member_id} updated its subscribed regex to: "
                                  f"{member.subscribed_topic_regex}.", member.member_id)
    if change.regexes:
        return RebalanceCause(RebalanceCategory.REGEX_RESOLVED,
                              f"Resolved regular expressions [{', '.join(sorted(change.regexes))}] to other topics.")
    previous_hash = before.metadata_hash if before is not None else 0
    return RebalanceCause(RebalanceCategory.TOPIC_METADATA_CHANGED,
                          f"Subscribed topic metadata changed: metadata hash {previous_hash} -> {bump.metadata_hash}.")


def _reconciled(observer: GroupObserver, group_id: str, was: ConsumerGroupMember | None,
                member: ConsumerGroupMember, target_epoch: int) -> None:
    """The steps of one member's move; nothing for a move that is none (a static member's -2)."""
    if member.member_epoch < 0:
        return
    was_state = was.state if was is not None else None
    steps = []
    if member.state is MemberState.UNREVOKED_PARTITIONS and was_state is not MemberState.UNREVOKED_PARTITIONS:
        steps.append(REVOCATION_REQUESTED)
    if was_state is MemberState.UNREVOKED_PARTITIONS and member.state is not MemberState.UNREVOKED_PARTITIONS:
        steps.append(REVOKED)
    if member.state is MemberState.UNRELEASED_PARTITIONS and was_state is not MemberState.UNRELEASED_PARTITIONS:
        steps.append(WAITING_FOR_PARTITIONS)
    before = was.assigned if was is not None else {}
    added = sum(1 for topic_id, ps in member.assigned.items() for p in ps if p not in before.get(topic_id, ()))
    if added:
        steps.append(ASSIGNED)
    if member.is_reconciled_to(target_epoch) and (was is None or not was.is_reconciled_to(target_epoch)):
        steps.append(EPOCH_REACHED)
    if steps:
        observer.on_consumer_member_reconciled(group_id, Reconciliation(
            member.member_id, tuple(steps), member.member_epoch, was.member_epoch if was is not None else 0,
            target_epoch, sum(len(ps) for ps in member.assigned.values()),
            sum(len(ps) for ps in member.pending_revocation.values()), added))
