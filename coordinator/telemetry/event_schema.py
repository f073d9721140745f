"""The event topic's schema (docs/state-topic.md, "Event topic"): one definition shared by the writer
(the `EventTopicObserver`) and the analytics job (analytics/, which builds its Spark schema from it), so the two
cannot drift. Plain Python: the service imports it, so it must never import pyspark.

Version rules: an event carries `version`; adding a field or an event type keeps the version (readers ignore
what they do not know, and skip unknown types), renaming or removing a field bumps it. A reader skips events of a
version newer than `EVENT_SCHEMA_VERSION` (and counts them) rather than misreading them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeGuard

from coordinator.group.state import COMPLETING, PREPARING, GroupState

EVENT_SCHEMA_VERSION = 1


class FieldType(str, Enum):
    STRING = "string"
    INT = "int"  # a Kafka int32 (generation, counts)
    LONG = "long"  # epoch or duration milliseconds


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    nullable: bool = False  # present, but may be JSON null (a dynamic member's group_instance_id)
    required: bool = True  # False: may be absent altogether (trace_id)


_S, _I, _L = FieldType.STRING, FieldType.INT, FieldType.LONG

COMMON_FIELDS: tuple[Field, ...] = (
    Field("version", _I),
    Field("type", _S),
    Field("group_id", _S),
    Field("ts_ms", _L),  # wall clock, ms since the Unix epoch
    # the rebalance's OpenTelemetry trace id (32 hex chars) when tracing is on: a row leads to its Jaeger trace
    Field("trace_id", _S, nullable=True, required=False),
    # "consumer" for a consumer group's event (KIP-848: group epochs; its rebalance_started carries the previous
    # group epoch as `generation`, rebalance_completed the epoch every member reached); absent: a classic group
    Field("protocol", _S, required=False),
)

_INSTANCE_ID = Field("group_instance_id", _S, nullable=True)
# outcome: "pending", "committed" or "aborted" (the type's last word: one column across the three types)
_TXN_FIELDS = (Field("transactional_id", _S, nullable=True), Field("producer_id", _L), Field("producer_epoch", _I),
               Field("partition_count", _I), Field("outcome", _S))

EVENT_FIELDS: dict[str, tuple[Field, ...]] = {
    "state_change": (Field("old_state", _S), Field("new_state", _S), Field("generation", _I)),
    # principal, security_protocol: the joining client's authenticated principal and its listener's protocol
    # (absent in older events)
    "member_joined": (Field("member_id", _S), _INSTANCE_ID, Field("client_id", _S), Field("client_host", _S),
                      Field("principal", _S, required=False), Field("security_protocol", _S, required=False)),
    "member_replaced": (Field("old_member_id", _S), Field("new_member_id", _S), Field("group_instance_id", _S)),
    "member_left": (Field("member_id", _S), _INSTANCE_ID, Field("reason", _S)),
    # detection_lateness_ms (how long after the session deadline the member was removed) is reserved: read
    # where a writer records it, absent otherwise
    "member_failed": (Field("member_id", _S), _INSTANCE_ID, Field("reason", _S),
                      Field("detection_lateness_ms", _L, nullable=True, required=False)),
    # cause_category: the coordinator's own RebalanceCategory (absent in older events: their reason text is read)
    "rebalance_started": (Field("generation", _I), Field("reason", _S), Field("cause_category", _S, required=False)),
    # duration_ms null: a consumer group's rebalance its owner loaded mid-way (its start was another instance's)
    "rebalance_completed": (Field("generation", _I), Field("member_count", _I),
                            Field("duration_ms", _L, nullable=True)),
    "offsets_committed": (Field("member_id", _S), Field("partition_count", _I)),
    "offsets_expired": (Field("partition_count", _I),),  # the retention check
    "offsets_deleted": (Field("partition_count", _I),),  # OffsetDelete
    "group_deleted": (Field("partition_count", _I),),  # DeleteGroups: the group and this many offsets
    # a client transaction's offsets (TxnOffsetCommit): pending in the state partition, then settled by the
    # transaction coordinator's marker; transactional_id null where the settling instance did not serve the
    # request (a failover, a restart); duration_ms from the first pending offset's commit time to the marker
    "txn_offsets_pending": _TXN_FIELDS,
    "txn_offsets_committed": _TXN_FIELDS + (Field("duration_ms", _L, nullable=True),),
    "txn_offsets_aborted": _TXN_FIELDS + (Field("duration_ms", _L, nullable=True),),
}

# The state names events carry are the classic group's (GroupState values), defined there only.
GROUP_STATES = tuple(state.value for state in GroupState)
REBALANCING_STATES = (PREPARING.value, COMPLETING.value)  # the group's members are not consuming


def all_fields() -> tuple[Field, ...]:
    """Every field of every event type once (the union a columnar reader parses into), common fields first.
    A name shared by several types has one type everywhere (checked in the tests)."""
    seen: dict[str, Field] = {field.name: field for field in COMMON_FIELDS}
    for fields in EVENT_FIELDS.values():
        for field in fields:
            seen.setdefault(field.name, Field(field.name, field.type, nullable=True, required=False))
    return tuple(seen.values())


class Problem(str, Enum):
    """Why a record is not a usable event; the analytics job counts skipped records by these names."""

    NOT_JSON = "not_json"  # not UTF-8 JSON, or not a JSON object, or a null value
    NO_VERSION = "no_version"  # no integer `version`
    FUTURE_VERSION = "future_version"  # written by a newer schema than this reader knows
    UNKNOWN_TYPE = "unknown_type"  # a type this reader does not know (added later) or none
    MISSING_FIELD = "missing_field"  # a required field absent or null where it may not be
    BAD_TYPE = "bad_type"  # a field of the wrong JSON type


_PY_TYPES = {_S: (str,), _I: (int,), _L: (int,)}
_INT32 = (-(2 ** 31), 2 ** 31 - 1)


def problem_of(event: Any) -> Problem | None:
    """None if `event` (a decoded JSON value) is a valid event of this schema, else what is wrong with it."""
    if not isinstance(event, Mapping):
        return Problem.NOT_JSON
    version = event.get("version")
    if not _is_int(version):
        return Problem.NO_VERSION
    if version > EVENT_SCHEMA_VERSION:
        return Problem.FUTURE_VERSION
    type_name = event.get("type")
    fields = EVENT_FIELDS.get(type_name) if isinstance(type_name, str) else None
    if fields is None:
        return Problem.UNKNOWN_TYPE
    for field in COMMON_FIELDS + fields:
        if field.name not in event:
            if field.required:
                return Problem.MISSING_FIELD
            continue
        value = event[field.name]
        if value is None:
            if not field.nullable:
                return Problem.MISSING_FIELD
        elif not _matches(value, field.type):
            return Problem.BAD_TYPE
    return None


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _matches(value: Any, field_type: FieldType) -> bool:
    if field_type is FieldType.STRING:
        return isinstance(value, str)
    if not _is_int(value):
        return False
    return field_type is FieldType.LONG or _INT32[0] <= value <= _INT32[1]


def new_event(event_type: str, group_id: str, ts_ms: int, **fields: Any) -> dict[str, Any]:
    """An event of this schema version (the writer's one constructor)."""
    return {"version": EVENT_SCHEMA_VERSION, "type": event_type, "group_id": group_id, "ts_ms": ts_ms, **fields}


# Why a rebalance started, as a category: the coordinator's reason texts (Kafka's wording) carry member ids, so
# they are grouped by these patterns, first match wins. Also Java-regex compatible (the job uses Spark's rlike).
REASON_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("member_joined", r"^Adding new member"),
    ("member_left", r"on LeaveGroup"),
    ("session_timeout", r"on heartbeat expiration"),
    ("sync_timeout", r"on pending sync request expiration"),
    ("static_member_rejoined", r"^Updating metadata for static member|static member .* change of protocol"),
    ("leader_rejoined", r"^Leader .* re-joining"),
    ("member_metadata_changed", r"^Updating metadata for member|^Member .* joining group"),
    ("store_error", r"when storing group assignment"),
    ("over_capacity", r"over capacity"),
    # consumer groups' (Kafka 4.1's lines, which their events' cause_category makes unnecessary to parse)
    ("rebalance_timeout", r"failed to transition from epoch|failed to join within the rebalance timeout"),
    ("subscription_changed", r"updated its subscribed (topics|regex)"),
    ("regex_resolved", r"^Resolved regular expressions"),
    ("topic_metadata_changed", r"^Subscribed topic metadata changed"),
)
OTHER_REASON = "other"
# The event's cause_category (a RebalanceCategory value) -> the category above, so old and new events agree.
CAUSE_CATEGORIES: dict[str, str] = {
    "member_joined": "member_joined",
    "member_rejoined": "member_metadata_changed",
    "metadata_changed": "member_metadata_changed",
    "leader_rejoined": "leader_rejoined",
    "static_member": "static_member_rejoined",
    "member_left": "member_left",
    "session_timeout": "session_timeout",
    "sync_timeout": "sync_timeout",
    "assignment_store_failed": "store_error",
    "over_capacity": "over_capacity",
    # consumer groups
    "rebalance_timeout": "rebalance_timeout",
    "subscription_changed": "subscription_changed",
    "regex_resolved": "regex_resolved",
    "topic_metadata_changed": "topic_metadata_changed",
}

_COMPILED_REASONS = tuple((name, re.compile(pattern)) for name, pattern in REASON_CATEGORIES)


def reason_category(reason: str | None, *, cause_category: str | None = None) -> str:
    """The category of a rebalance_started event: from its cause_category when it has one, else its reason text."""
    if cause_category is not None:
        return CAUSE_CATEGORIES.get(cause_category, OTHER_REASON)
    for name, pattern in _COMPILED_REASONS:
        if reason is not None and pattern.search(reason):
            return name
    return OTHER_REASON
