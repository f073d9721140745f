"""The consumer group records' codec: any record round-trips, and truncated or trailing bytes are refused with
RecordFormatError (never another exception). Kafka's own decoder reads them in
tests/interop/test_consumer_records_kafka.py."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.group.modern.records import (CurrentAssignmentRecord, GroupEpochRecord, MemberMetadataRecord,
                                              PER_MEMBER_TYPES, RecordType, RegexRecord, TargetAssignmentEpochRecord,
                                              TargetAssignmentRecord, Tombstone)
from coordinator.storage._wire import RecordFormatError
from coordinator.storage.consumer_records import decode, encode_key, encode_value

names = st.text(max_size=20)
optional_names = st.none() | names
int32 = st.integers(-(2**31), 2**31 - 1)
partitions = st.dictionaries(st.uuids(), st.lists(st.integers(0, 2**31 - 1), max_size=6, unique=True).map(
    lambda ps: tuple(sorted(ps))), max_size=4)

records = st.one_of(
    st.builds(GroupEpochRecord, names, int32, st.integers(-(2**63), 2**63 - 1)),
    st.builds(MemberMetadataRecord, names, names, optional_names, optional_names, names, names,
              st.lists(names, max_size=4).map(tuple), optional_names, int32, optional_names),
    st.builds(TargetAssignmentEpochRecord, names, int32),
    st.builds(TargetAssignmentRecord, names, names, partitions),
    st.builds(CurrentAssignmentRecord, names, names, int32, int32, st.sampled_from([0, 1, 2, 127]), partitions,
              partitions),
    st.builds(RegexRecord, names, names, st.lists(names, max_size=4).map(lambda ts: tuple(sorted(ts))),
              st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda kind, group, key: Tombstone(kind, group, key if kind in PER_MEMBER_TYPES else None,
                                                 key if kind is RecordType.REGULAR_EXPRESSION else None),
              st.sampled_from([t for t in RecordType if t is not RecordType.PARTITION_METADATA]), names, names),
)


@settings(max_examples=300, deadline=None)
@given(records)
def test_every_record_round_trips(record) -> None:  # type: ignore[no-untyped-def]
    assert decode(encode_key(record), encode_value(record)) == record


@settings(max_examples=150, deadline=None)
@given(records, st.data())
def test_truncated_or_padded_values_are_refused(record, data) -> None:  # type: ignore[no-untyped-def]
    value = encode_value(record)
    if value is None:
        return
    cut = data.draw(st.integers(0, len(value) - 1))
    for broken in (value[:cut], value + b"\x00"):
        try:
            decoded = decode(encode_key(record), broken)
        except RecordFormatError:
            continue
        raise AssertionError(f"{broken.hex()} decoded as {decoded}")


def test_kafka_4_0_partition_metadata_and_other_types_are_skipped() -> None:
    key = b"\x00\x04" + b"\x00\x01g"
    assert decode(key, b"\x00\x00\x01\x00") is None  # type 4: Kafka 4.1 no longer reads it either
    assert decode(b"\x00\x02\x00\x01g", None) is None  # type 2: a classic group's, not ours


def test_layout_of_a_current_assignment() -> None:
    topic = uuid.UUID(int=1)
    record = CurrentAssignmentRecord("g", "m", 3, 2, 1, {topic: (0, 5)}, {})
    assert encode_key(record) == b"\x00\x08\x00\x01g\x00\x01m"
    assert encode_value(record) == (b"\x00\x00" + b"\x00\x00\x00\x03" + b"\x00\x00\x00\x02" + b"\x01"
                                    + b"\x02" + topic.bytes + b"\x03" + b"\x00\x00\x00\x00\x00\x00\x00\x05" + b"\x00"
                                    + b"\x01" + b"\x00")
