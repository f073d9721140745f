"""OffsetCommit against a consumer group (Kafka's ConsumerGroup.validateOffsetCommit): the member epoch stands for
the generation. The offsets themselves are kept with the classic ones (coordinator/group/offsets.py)."""

from __future__ import annotations

from coordinator.group.modern.group import ConsumerGroup
from protocol.error_codes import Errors

OFFSET_COMMIT_MIN_VERSION_FOR_CONSUMER_MEMBERS = 9


def validate_offset_commit(group: ConsumerGroup, member_id: str, member_epoch: int, version: int) -> Errors | None:
    """None if the commit may proceed. Epoch < 0 on an empty group: an admin client or a consumer without group
    management."""
    if member_epoch < 0 and not group.members:
        return None
    member = group.members.get(member_id)
    if member is None:
        return Errors.UNKNOWN_MEMBER_ID
    if version < OFFSET_COMMIT_MIN_VERSION_FOR_CONSUMER_MEMBERS:
        return Errors.UNSUPPORTED_VERSION
    if member_epoch != member.member_epoch:
        return Errors.STALE_MEMBER_EPOCH
    return None
