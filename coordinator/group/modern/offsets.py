"""OffsetCommit and OffsetFetch against a consumer group (Kafka's ConsumerGroup.validateOffsetCommit/Fetch): the
member epoch stands for the generation. The offsets themselves are kept with the classic ones
(coordinator/group/offsets.py)."""

from __future__ import annotations

from coordinator.group.modern.group import ConsumerGroup
from protocol.error_codes import Errors

OFFSET_COMMIT_MIN_VERSION_FOR_CONSUMER_MEMBERS = 9


def validate_offset_commit(group: ConsumerGroup, member_id: str, member_epoch: int, version: int, *,
                           transactional: bool = False) -> Errors | None:
    """None if the commit may proceed. Epoch < 0 on an empty group: an admin client or a consumer without group
    management. A transactional commit (TxnOffsetCommit) has no OffsetCommit version floor."""
    if member_epoch < 0 and not group.members:
        return None
    member = group.members.get(member_id)
    if member is None:
        return Errors.UNKNOWN_MEMBER_ID
    if member.uses_classic_protocol:  # a classic member inside the group: its generation is its epoch
        return Errors.ILLEGAL_GENERATION if member_epoch != member.member_epoch else None
    if not transactional and version < OFFSET_COMMIT_MIN_VERSION_FOR_CONSUMER_MEMBERS:
        return Errors.UNSUPPORTED_VERSION
    if member_epoch != member.member_epoch:
        return Errors.STALE_MEMBER_EPOCH
    return None


def validate_offset_fetch(group: ConsumerGroup, member_id: str | None, member_epoch: int) -> Errors | None:
    """Kafka's ConsumerGroup.validateOffsetFetch: no member id and epoch < 0 is an admin client or a client that
    does not say (accepted); otherwise the member must exist at that epoch."""
    if member_id is None and member_epoch < 0:
        return None
    member = group.members.get(member_id or "")
    if member is None:
        return Errors.UNKNOWN_MEMBER_ID
    if member_epoch != member.member_epoch:
        return Errors.STALE_MEMBER_EPOCH
    return None
