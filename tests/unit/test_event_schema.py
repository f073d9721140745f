"""The event schema shared by the writer and the analytics job: what it accepts, what it rejects and why, that
the writer's events conform to it, and the reason categories of the coordinator's own reason texts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from coordinator.group.observer import RebalanceCategory, RebalanceCause
from coordinator.telemetry import event_schema as schema
from coordinator.telemetry.event_schema import Problem, problem_of, reason_category

try:  # the writer moves to coordinator/telemetry/events.py (issue 9)
    from coordinator.telemetry.events import EventTopicObserver
except ImportError:
    from coordinator.storage.events import EventTopicObserver
from coordinator.timer.clock import ManualClock


def valid(**overrides: Any) -> dict[str, Any]:
    event = schema.new_event("rebalance_completed", "g", 1_700_000_000_000, generation=3, member_count=2,
                             duration_ms=120)
    event.update(overrides)
    return event


class Capture:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, group_id: str, event: dict[str, Any]) -> None:
        assert group_id == event["group_id"]
        self.events.append(json.loads(json.dumps(event)))  # as it travels


def test_every_event_the_writer_emits_conforms_to_the_schema() -> None:
    capture = Capture()
    observer = EventTopicObserver(capture, ManualClock(1_700_000_000_000), trace_id_for=lambda _g: "ab" * 16,
                                  include_offset_commits=True)  # type: ignore[arg-type]
    observer.on_state_change("g", "Empty", "PreparingRebalance", 0)
    observer.on_member_joined("g", "m1", None, "client", "/127.0.0.1")
    observer.on_member_replaced("g", "m1", "m2", "instance")
    observer.on_member_left("g", "m2", "instance", "bye")
    observer.on_member_failed("g", "m3", None, "session timeout")
    observer.on_rebalance_started("g", 0, RebalanceCause(RebalanceCategory.MEMBER_JOINED, "Adding new member m1"))
    observer.on_rebalance_completed("g", 1, 1, 15)
    observer.on_offsets_committed("g", "m1", 3)
    observer.on_offsets_expired("g", 2)
    observer.on_offsets_deleted("g", 1)
    observer.on_group_deleted("g", 0)
    observer.on_txn_offsets_pending("g", "app", 7, 0, 2)
    observer.on_txn_group_offsets_settled("g", "app", 7, 0, True, 2, 1_699_999_999_250)
    observer.on_txn_group_offsets_settled("g", None, 8, 1, False, 1, None)  # settled after a reload
    assert sorted(e["type"] for e in capture.events) == sorted(schema.EVENT_FIELDS)  # every type, once
    txn_events = {e["type"]: e for e in capture.events if e["type"].startswith("txn_")}
    assert [(e["outcome"], e["transactional_id"], e["producer_id"], e.get("duration_ms"))
            for e in txn_events.values()] == [("pending", "app", 7, None), ("committed", "app", 7, 750),
                                              ("aborted", None, 8, None)]
    for event in capture.events:
        assert problem_of(event) is None, event
        declared = {f.name for f in schema.COMMON_FIELDS + schema.EVENT_FIELDS[event["type"]]}
        required = {f.name for f in schema.COMMON_FIELDS + schema.EVENT_FIELDS[event["type"]] if f.required}
        assert required <= set(event) <= declared, event  # nothing undeclared: the job would not read it
        assert event["trace_id"] == "ab" * 16


def test_a_field_name_has_one_type_across_event_types() -> None:
    types: dict[str, schema.FieldType] = {}
    for fields in schema.EVENT_FIELDS.values():
        for field in schema.COMMON_FIELDS + fields:
            assert types.setdefault(field.name, field.type) is field.type, field
    assert {f.name for f in schema.all_fields()} == set(types)


@pytest.mark.parametrize(("event", "problem"), [
    (valid(), None),
    (valid(trace_id=None), None),
    (valid(extra_field_added_later=1), None),
    ([1, 2], Problem.NOT_JSON),
    ("text", Problem.NOT_JSON),
    (None, Problem.NOT_JSON),
    ({k: v for k, v in valid().items() if k != "version"}, Problem.NO_VERSION),
    (valid(version="1"), Problem.NO_VERSION),
    (valid(version=True), Problem.NO_VERSION),
    (valid(version=2), Problem.FUTURE_VERSION),
    (valid(type="shiny_new_event"), Problem.UNKNOWN_TYPE),
    ({k: v for k, v in valid().items() if k != "duration_ms"}, Problem.MISSING_FIELD),
    (valid(member_count=None), Problem.MISSING_FIELD),
    (valid(duration_ms=None), None),  # a consumer group's rebalance finished by an owner that loaded it mid-way
    (valid(generation="3"), Problem.BAD_TYPE),
    (valid(generation=2 ** 31), Problem.BAD_TYPE),
    (valid(ts_ms=1.5), Problem.BAD_TYPE),
    (schema.new_event("member_failed", "g", 1, member_id="m", group_instance_id=None, reason="r"), None),
    (schema.new_event("member_failed", "g", 1, member_id="m", reason="r"), Problem.MISSING_FIELD),
])
def test_problem_of(event: Any, problem: Problem | None) -> None:
    assert problem_of(event) == problem


@pytest.mark.parametrize(("reason", "category"), [
    ("Adding new member m-1 with group instance id None; client reason: not provided", "member_joined"),
    ("Removing member m-1 on LeaveGroup; client reason: the consumer is being closed", "member_left"),
    ("removing member m-1 on heartbeat expiration", "session_timeout"),
    ("Removing ['m-1'] on pending sync request expiration", "sync_timeout"),
    ("Updating metadata for static member m-2 with instance id i; client reason: x", "static_member_rejoined"),
    ("Group's selectedProtocol will change because static member m-2 with instance id i joined with change of "
     "protocol; client reason: x", "static_member_rejoined"),
    ("Leader m-1 re-joining group during Stable; client reason: x", "leader_rejoined"),
    ("Updating metadata for member m-1 during Stable; client reason: x", "member_metadata_changed"),
    ("Error NOT_ENOUGH_REPLICAS when storing group assignment during SyncGroup (member: m-1)", "store_error"),
    ("Freshly-loaded group is over capacity (10). Rebalancing in order to give a chance for consumers to commit "
     "offsets", "over_capacity"),
    ("something new", "other"),
    (None, "other"),
])
def test_reason_categories(reason: str | None, category: str) -> None:
    assert reason_category(reason) == category


def test_every_cause_category_has_a_report_category() -> None:
    assert {category.value for category in RebalanceCategory} == set(schema.CAUSE_CATEGORIES)
    assert set(schema.CAUSE_CATEGORIES.values()) <= {name for name, _ in schema.REASON_CATEGORIES}


def test_the_cause_category_wins_over_a_misleading_client_reason() -> None:
    text = "Adding new member m-1 with group instance id None; client reason: rejoin on LeaveGroup"
    assert reason_category(text, cause_category=RebalanceCategory.MEMBER_JOINED.value) == "member_joined"
    assert reason_category("Removing member m-1 on LeaveGroup; client reason: Adding new member",
                           cause_category=RebalanceCategory.MEMBER_LEFT.value) == "member_left"
    assert reason_category(text, cause_category="a_category_from_a_newer_writer") == "other"
