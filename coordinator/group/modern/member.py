"""A consumer group member (Kafka's ConsumerGroupMember): identity and subscription (record 5) and its current
assignment, epochs and reconciliation state (record 8). Immutable: a change is a new member, compared with the old
one to decide which records to write."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from dataclasses import dataclass, field

from coordinator.group.modern.records import (ClassicMemberMetadata, CurrentAssignmentRecord, MemberMetadataRecord,
                                              Partitions)

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class MemberState(enum.IntEnum):
    """Kafka's modern MemberState, with the values it stores in record 8."""

    STABLE = 0  # has its target, or all of it it may have now
    UNREVOKED_PARTITIONS = 1  # must revoke partitions first; its epoch waits
    UNRELEASED_PARTITIONS = 2  # at the target epoch, waiting for partitions other members still own
    UNKNOWN = 127


@dataclass(frozen=True, slots=True)
class ConsumerGroupMember:
    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()  # sorted
    subscribed_topic_regex: str | None = ""  # Kafka keeps "" for no regular expression, and writes it
    server_assignor: str | None = None
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    classic: ClassicMemberMetadata | None = None  # set for a member that joined with JoinGroup

    @property
    def uses_classic_protocol(self) -> bool:
        return self.classic is not None

    def replace(self, **changes: object) -> ConsumerGroupMember:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def with_epoch(self, epoch: int) -> ConsumerGroupMember:
        """Kafka's Builder.updateMemberEpoch: the old epoch becomes the previous one."""
        return self._with_assignment_state(epoch, self.member_epoch, self.state, self.assigned,
                                           self.pending_revocation)

    def moved_to(self, epoch: int, state: MemberState, assigned: Partitions,
                 pending_revocation: Partitions) -> ConsumerGroupMember:
        """`with_epoch(epoch)` with record 8's other fields: a reconciliation's step (reconciliation.py)."""
        return self._with_assignment_state(epoch, self.member_epoch, state, assigned, pending_revocation)

    def _with_assignment_state(self, member_epoch: int, previous_member_epoch: int, state: MemberState,
                               assigned: Partitions, pending_revocation: Partitions) -> ConsumerGroupMember:
        """This member with record 8's fields replaced, every other field its own: `replace` for the calls made
        once per reconciling heartbeat and per replayed record 8 (dataclasses.replace looks up each field by name:
        ~5 us a call, compiled or not, three calls per reconciled member)."""
        return ConsumerGroupMember(
            member_id=self.member_id, member_epoch=member_epoch, previous_member_epoch=previous_member_epoch,
            state=state, instance_id=self.instance_id, rack_id=self.rack_id,
            rebalance_timeout_ms=self.rebalance_timeout_ms, client_id=self.client_id, client_host=self.client_host,
            subscribed_topic_names=self.subscribed_topic_names, subscribed_topic_regex=self.subscribed_topic_regex,
            server_assignor=self.server_assignor, assigned=assigned, pending_revocation=pending_revocation,
            classic=self.classic)

    def is_reconciled_to(self, target_epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == target_epoch

    def same_subscription_metadata(self, other: ConsumerGroupMember) -> bool:
        """Whether record 5's fields are equal."""
        return self.metadata_record("") == other.metadata_record("")

    def same_assignment_state(self, other: ConsumerGroupMember) -> bool:
        """Whether record 8's fields are equal."""
        return self.assignment_record("") == other.assignment_record("")

    def metadata_record(self, group_id: str) -> MemberMetadataRecord:
        return MemberMetadataRecord(group_id, self.member_id, self.instance_id, self.rack_id, self.client_id,
                                    self.client_host, self.subscribed_topic_names, self.subscribed_topic_regex,
                                    self.rebalance_timeout_ms, self.server_assignor, self.classic)

    def assignment_record(self, group_id: str) -> CurrentAssignmentRecord:
        return CurrentAssignmentRecord(group_id, self.member_id, self.member_epoch, self.previous_member_epoch,
                                       int(self.state), self.assigned, self.pending_revocation)

    def with_metadata(self, record: MemberMetadataRecord) -> ConsumerGroupMember:
        return self.replace(instance_id=record.instance_id, rack_id=record.rack_id, client_id=record.client_id,
                            client_host=record.client_host, subscribed_topic_names=record.subscribed_topic_names,
                            subscribed_topic_regex=record.subscribed_topic_regex,
                            rebalance_timeout_ms=record.rebalance_timeout_ms, server_assignor=record.server_assignor,
                            classic=record.classic)

    def with_assignment(self, record: CurrentAssignmentRecord) -> ConsumerGroupMember:
        try:
            state = MemberState(record.state)
        except ValueError:
            state = MemberState.UNKNOWN
        return self._with_assignment_state(record.member_epoch, record.previous_member_epoch, state, record.assigned,
                                           record.pending_revocation)

    def owned_topic_ids(self) -> set[uuid.UUID]:
        return set(self.assigned) | set(self.pending_revocation)
