"""Deleting a consumer group (DeleteGroups): Kafka 4.1's ConsumerGroup.validateDeleteGroup; the tombstones are the
ones a conversion writes (conversion.consumer_group_tombstones, Kafka's createGroupTombstoneRecords)."""

from __future__ import annotations

from coordinator.group.modern.group import ConsumerGroup, ConsumerGroupState
from protocol.error_codes import Errors


def delete_error(group: ConsumerGroup) -> Errors | None:
    """Only an Empty consumer group may be deleted."""
    return None if group.state is ConsumerGroupState.EMPTY else Errors.NON_EMPTY_GROUP
