"""ConsumerGroup.snapshot, made by hand (a compiled class cannot be copied with copy.copy): every attribute the
group has is in the copy, and no map is shared with the group (a failed write goes back to the copy)."""

from __future__ import annotations

import uuid
from collections import Counter

from coordinator.group.modern.group import ConsumerGroup

# what a group holds (pure: vars() of a new group must name these and no more, so a new attribute is not forgotten)
ATTRIBUTES = ("group_id", "group_epoch", "metadata_hash", "assignment_epoch", "members", "static_members", "targets",
              "_ordered_targets", "_partition_epochs", "_subscriptions", "_regex_subscribers", "resolved_regexes",
              "deleted", "metadata_refresh_deadline_ms")


def test_a_snapshot_copies_every_attribute_and_shares_no_map() -> None:
    group = ConsumerGroup("g")
    if hasattr(group, "__dict__"):  # the pure class (a compiled instance has no __dict__)
        assert sorted(vars(group)) == sorted(ATTRIBUTES)
    topic = uuid.uuid4()
    group.group_epoch, group.metadata_hash, group.assignment_epoch = 5, 77, 4
    group.deleted, group.metadata_refresh_deadline_ms = True, 1234
    group.members = {"m": object()}  # type: ignore[dict-item]
    group.static_members = {"i": "m"}
    group.targets = {"m": {topic: frozenset({0})}}  # type: ignore[dict-item]
    group._ordered_targets = {"m": ({}, ())}  # type: ignore[dict-item]
    group._partition_epochs = {(topic, 0): (4, "m")}
    group._subscriptions, group._regex_subscribers = Counter({"t": 1}), Counter({"t.*": 2})
    group.resolved_regexes = {"t.*": object()}  # type: ignore[dict-item]
    clone = group.snapshot()
    for name in ATTRIBUTES:
        kept, copied = getattr(group, name), getattr(clone, name)
        assert copied == kept, name
        if isinstance(kept, dict):
            assert copied is not kept, f"{name} is shared with the group"
    assert ConsumerGroup.protocol_type == "consumer" == clone.protocol_type
