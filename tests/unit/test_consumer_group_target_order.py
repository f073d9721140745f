"""A target computation's input kept between computations: each member's current target in Kafka's iteration order
(`ConsumerGroup.ordered_target`) and each member id's Java hash (`java_order.string_hash`), so that a join to a large
group orders and hashes only what changed since the last computation. What the assignor is given, and so the
targets, stay what a group with nothing kept computes. The group logic's own functions (heartbeat.py), no runtime."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from coordinator.group.assignor import java_order, spec
from coordinator.group.modern.group import ConsumerGroup, GroupUndo
from coordinator.group.modern.heartbeat import HeartbeatRequest, Settings, heartbeat
from coordinator.group.modern.records import ConsumerGroupRecord, TargetAssignmentRecord
from coordinator.topics import StaticTopics, TopicImage

TOPIC = uuid.UUID(int=0xF00)
MEMBERS = 40
TOPICS = StaticTopics([TopicImage(TOPIC, "t", 2 * MEMBERS + 2)])
SETTINGS = Settings(heartbeat_interval_ms=250, max_size=10_000)


class _Timers:
    def schedule_session(self, *_: Any) -> None: ...
    def schedule_rebalance(self, *_: Any) -> None: ...
    def cancel_rebalance(self, *_: Any) -> None: ...
    def cancel_all(self, *_: Any) -> None: ...


class Group:
    """A consumer group changed only through the group logic's heartbeats, every record replayed and kept."""

    def __init__(self) -> None:
        self.group: ConsumerGroup | None = None
        self.log: list[ConsumerGroupRecord] = []

    def beat(self, request: HeartbeatRequest, undo: GroupUndo | None = None) -> list[ConsumerGroupRecord]:
        """The heartbeat's records, replayed (captured by `undo` first, and then not kept in the log)."""
        result = heartbeat(self.group, request, TOPICS, SETTINGS, _Timers(), 1_000)
        if result.created is not None:
            self.group = result.created
        assert self.group is not None
        if undo is not None:
            undo.capture(result.records)
        for record in result.records:
            self.group.replay(record)
        if undo is None:
            self.log.extend(result.records)
        return result.records

    def join(self, member_id: str, undo: GroupUndo | None = None) -> list[ConsumerGroupRecord]:
        return self.beat(HeartbeatRequest("g", member_id, 0, rebalance_timeout_ms=60_000,
                                          subscribed_topic_names=("t",), owned=[]), undo)

    def reconcile_all(self) -> None:
        """Every member heartbeats with what it was last told until each holds its target."""
        for _ in range(3):
            assert self.group is not None
            for member in list(self.group.members.values()):
                self.beat(HeartbeatRequest("g", member.member_id, member.member_epoch,
                                           owned=list(member.assigned.items())))

    def leave(self, member_id: str) -> None:
        assert self.group is not None
        self.beat(HeartbeatRequest("g", member_id, -1))


def formed(count: int) -> Group:
    group = Group()
    for index in range(count):
        group.join(f"member-{index}")
    group.reconcile_all()
    return group


def counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls = [0]
    original: Callable[..., Any] = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_join_orders_only_the_targets_changed_since_the_last_computation(monkeypatch: pytest.MonkeyPatch) -> None:
    group = formed(MEMBERS)
    changed = sum(isinstance(r, TargetAssignmentRecord) for r in group.join("first-joiner"))
    orderings = counting(monkeypatch, spec, "topic_map_order")  # one per target ordered (`spec.ordered`)
    records = group.join("second-joiner")
    assert any(isinstance(r, TargetAssignmentRecord) for r in records)  # a target was computed
    # the first joiner's changes and the second joiner's own (empty) target; not every member's again
    assert orderings[0] <= changed + 1, (orderings[0], changed)


def test_kept_orders_give_the_targets_a_group_with_nothing_kept_computes() -> None:
    warm = formed(MEMBERS)
    for index in range(3):  # targets computed and changed, members gone: what is kept follows every change
        warm.join(f"joiner-{index}")
        warm.reconcile_all()
    warm.leave("member-3")
    assert warm.group is not None
    undo = warm.group.undo_point()  # records replayed, then undone: the targets before them are the group's again
    warm.join("undone", undo)
    undo.restore()
    cold = Group()
    cold.group = ConsumerGroup("g")
    for record in warm.log:
        cold.group.replay(record)
    assert cold.group.targets == warm.group.targets
    assert warm.join("last") == cold.join("last")


def test_a_member_id_is_hashed_once_for_every_target_computation() -> None:
    ids = [f"member-{index}" for index in range(MEMBERS)]
    java_order.string_hash.cache_clear()
    first = java_order.member_order(ids)
    assert java_order.member_order(ids) == first
    info = java_order.string_hash.cache_info()
    assert (info.misses, info.hits) == (MEMBERS, MEMBERS)
