"""A member as it was before an operation changed it without a rebalance, restored as a whole if the record that
operation wrote is not acknowledged.

A consumer group's state goes back to its snapshot when its records are not written (`ConsumerGroup.snapshot`,
as Kafka 4 rolls its timeline back to the last committed offset). A classic group's members are not kept that
way, in Kafka 4 either: its GroupMetadataManager undoes a failed static replacement member by member. So what a
failed write of a classic group undoes is the one member that write re-identified or updated (a static member
replaced in a Stable group): the group's other changes meanwhile (other members joining, leaving, heartbeating)
stand, as in Kafka. The snapshot holds what the member's record carries and its protocols; what is
live (parked requests, heartbeat deadlines) is not state to go back to."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from coordinator.group.api import JoinGroupResponse
from coordinator.group.member import MemberMetadata, Protocols
from coordinator.group.metadata import GroupMetadata


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    member_id: str
    group_instance_id: str | None
    protocols: Protocols
    rebalance_timeout_ms: int
    session_timeout_ms: int

    @classmethod
    def of(cls, member: MemberMetadata) -> MemberSnapshot:
        return cls(member.member_id, member.group_instance_id, list(member.supported_protocols),
                   member.rebalance_timeout_ms, member.session_timeout_ms)

    def restore(self, group: GroupMetadata, member: MemberMetadata) -> asyncio.Future[JoinGroupResponse] | None:
        """Puts `member` (the snapshot's, under whatever id it has now) back as it was: its id (and with it the
        static mapping and the leadership), protocols and timeouts. Returns the JoinGroup the member had parked,
        which is no longer its own: the caller answers it."""
        parked = member.join_future
        group.update_member(member, self.protocols, self.rebalance_timeout_ms, self.session_timeout_ms, None)
        if member.member_id != self.member_id:
            assert self.group_instance_id is not None  # only a static member is re-identified
            group.replace_static_member(self.group_instance_id, member.member_id, self.member_id)
        return parked
