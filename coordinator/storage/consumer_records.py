"""Bytes of the consumer group records (coordinator/group/modern/records.py, types 3-8 and 16) in
`__consumer_offsets` format.

Key: int16 record type, then the key's version-0 fields, non-flexible (strings with int16 lengths).
Value: int16 version (0), then the value's fields, flexible (compact strings and arrays, a tagged-field section
per struct); a tombstone has no value. Written from Kafka 4.1's JSON definitions (ConsumerGroup*Key/Value.json).
Tagged fields written: MetadataHash (tag 0 of type 3) when not 0; ClassicMemberMetadata (tag 0 of type 5, a
nullable struct: a presence varint 1, then the struct) for a member that speaks the classic protocol. Read and
skipped: any other tag.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid

from coordinator.group.modern.records import (PER_MEMBER_TYPES, ClassicMemberMetadata, ConsumerGroupRecord, CurrentAssignmentRecord,
                                              GroupEpochRecord, MemberMetadataRecord, Partitions, RecordType,
                                              RegexRecord, TargetAssignmentEpochRecord, TargetAssignmentRecord,
                                              Tombstone)
from coordinator.storage._wire import Reader, RecordFormatError, Writer

CONSUMER_GROUP_TYPES = frozenset(int(t) for t in RecordType)
_METADATA_HASH_TAG = 0
_CLASSIC_MEMBER_METADATA_TAG = 0
_VALUE_VERSION = 0


class _Writer(Writer):
    def int8(self, value: int) -> None:
        self.bytes_raw(struct.pack(">b", value))

    def uuid(self, value: uuid.UUID) -> None:
        self.bytes_raw(value.bytes)

    def bytes_raw(self, data: bytes) -> None:
        self._out += data  # noqa: SLF001 (the base class's buffer)

    def strings(self, values: tuple[str, ...]) -> None:
        self.array_length(len(values))
        for value in values:
            self.string(value)

    def partitions(self, partitions: Partitions) -> None:
        self.array_length(len(partitions))
        for topic_id, ps in partitions.items():
            self.uuid(topic_id)
            self.array_length(len(ps))
            for p in ps:
                self.int32(p)
            self.tagged_fields()


class _Reader(Reader):
    def int8(self) -> int:
        value: int = struct.unpack(">b", self._take(1))[0]
        return value

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self._take(16))

    def strings(self) -> tuple[str, ...]:
        return tuple(self.string() for _ in range(self.array_length()))

    def partitions(self) -> Partitions:
        result: Partitions = {}
        for _ in range(self.array_length()):
            topic_id = self.uuid()
            result[topic_id] = tuple(self.int32() for _ in range(self.array_length()))
            self.skip_tagged_fields()
        return result


def encode_key(record: ConsumerGroupRecord) -> bytes:
    out = _Writer(flexible=False)
    record_type = RecordType(record.record_type)
    out.int16(int(record_type))
    out.string(record.group_id)
    if record_type is RecordType.REGULAR_EXPRESSION:
        regex = getattr(record, "regex", None)
        if regex is None:
            raise RecordFormatError("record type 16 needs a regular expression")
        out.string(regex)
    elif record_type in PER_MEMBER_TYPES:
        member_id = getattr(record, "member_id", None)
        if member_id is None:
            raise RecordFormatError(f"record type {int(record_type)} needs a member id")
        out.string(member_id)
    return out.getvalue()


def encode_value(record: ConsumerGroupRecord) -> bytes | None:
    """The value bytes; None for a tombstone."""
    if isinstance(record, Tombstone):
        return None
    out = _Writer(flexible=True)
    out.int16(_VALUE_VERSION)
    if isinstance(record, GroupEpochRecord):
        out.int32(record.epoch)
        if record.metadata_hash:
            out.uvarint(1)
            out.uvarint(_METADATA_HASH_TAG)
            out.uvarint(8)
            out.int64(record.metadata_hash)
        else:
            out.tagged_fields()
    elif isinstance(record, MemberMetadataRecord):
        out.string(record.instance_id, nullable=True)
        out.string(record.rack_id, nullable=True)
        out.string(record.client_id)
        out.string(record.client_host)
        out.strings(record.subscribed_topic_names)
        out.string(record.subscribed_topic_regex, nullable=True)
        out.int32(record.rebalance_timeout_ms)
        out.string(record.server_assignor, nullable=True)
        if record.classic is None:
            out.tagged_fields()
        else:
            struct_bytes = _classic_member_metadata(record.classic)
            out.uvarint(1)
            out.uvarint(_CLASSIC_MEMBER_METADATA_TAG)
            out.uvarint(len(struct_bytes) + 1)
            out.uvarint(1)  # present (the field is a nullable struct)
            out.bytes_raw(struct_bytes)
    elif isinstance(record, TargetAssignmentEpochRecord):
        out.int32(record.assignment_epoch)
        out.tagged_fields()
    elif isinstance(record, TargetAssignmentRecord):
        out.partitions(record.partitions)
        out.tagged_fields()
    elif isinstance(record, RegexRecord):
        out.strings(record.topics)
        out.int64(record.version)
        out.int64(record.timestamp_ms)
        out.tagged_fields()
    elif isinstance(record, CurrentAssignmentRecord):
        out.int32(record.member_epoch)
        out.int32(record.previous_member_epoch)
        out.int8(record.state)
        out.partitions(record.assigned)
        out.partitions(record.pending_revocation)
        out.tagged_fields()
    else:
        raise RecordFormatError(f"not a consumer group record: {record!r}")
    return out.getvalue()


def _classic_member_metadata(classic: ClassicMemberMetadata) -> bytes:
    out = _Writer(flexible=True)
    out.int32(classic.session_timeout_ms)
    out.array_length(len(classic.protocols))
    for name, metadata in classic.protocols:
        out.string(name)
        out.bytes_(metadata)
        out.tagged_fields()
    out.tagged_fields()
    return out.getvalue()


def _read_classic_member_metadata(values: _Reader) -> ClassicMemberMetadata | None:
    if values.uvarint() == 0:
        return None
    session_timeout_ms = values.int32()
    protocols = []
    for _ in range(values.array_length()):
        name, metadata = values.string(), values.bytes_()
        values.skip_tagged_fields()
        protocols.append((name, metadata))
    values.skip_tagged_fields()
    return ClassicMemberMetadata(session_timeout_ms, tuple(protocols))


def record_type_of(key: bytes) -> int:
    return _Reader(key).int16()


def decode(key: bytes, value: bytes | None) -> ConsumerGroupRecord | None:
    """The typed record of a key/value of types 3-8; None for type 4 (Kafka 4.0's partition metadata, which 4.1
    no longer reads) and for a record type that is not a consumer group's."""
    keys = _Reader(key)
    record_type = keys.int16()
    if record_type not in CONSUMER_GROUP_TYPES:
        return None
    kind = RecordType(record_type)
    group_id = keys.string()
    member_id = keys.string() if kind in PER_MEMBER_TYPES else None
    regex = keys.string() if kind is RecordType.REGULAR_EXPRESSION else None
    keys.expect_end()
    if kind is RecordType.PARTITION_METADATA:
        return None
    if value is None:
        return Tombstone(kind, group_id, member_id, regex)
    if kind is RecordType.REGULAR_EXPRESSION:
        values = _Reader(value, flexible=True)
        if values.int16() != _VALUE_VERSION:
            raise RecordFormatError("record type 16: unknown value version")
        resolved = RegexRecord(group_id, regex or "", values.strings(), values.int64(), values.int64())
        values.skip_tagged_fields()
        values.expect_end()
        return resolved
    values = _Reader(value, flexible=True)
    version = values.int16()
    if version != _VALUE_VERSION:
        raise RecordFormatError(f"record type {record_type}: unknown value version {version}")
    record = _decode_value(kind, group_id, member_id or "", values)
    values.expect_end()
    return record


def _decode_value(kind: RecordType, group_id: str, member_id: str, values: _Reader) -> ConsumerGroupRecord:
    if kind is RecordType.GROUP_METADATA:
        epoch = values.int32()
        metadata_hash = 0
        for _ in range(values.uvarint()):
            tag, size = values.uvarint(), values.uvarint()
            if tag == _METADATA_HASH_TAG and size == 8:
                metadata_hash = values.int64()
            else:
                values._take(size)  # noqa: SLF001 (an unknown tag is skipped, as Kafka does)
        return GroupEpochRecord(group_id, epoch, metadata_hash)
    if kind is RecordType.MEMBER_METADATA:
        record = MemberMetadataRecord(
            group_id, member_id, instance_id=values.nullable_string(), rack_id=values.nullable_string(),
            client_id=values.string(), client_host=values.string(),
            subscribed_topic_names=values.strings(), subscribed_topic_regex=values.nullable_string(),
            rebalance_timeout_ms=values.int32(), server_assignor=values.nullable_string())
        for _ in range(values.uvarint()):
            tag, size = values.uvarint(), values.uvarint()
            if tag == _CLASSIC_MEMBER_METADATA_TAG:
                record = dataclasses.replace(record, classic=_read_classic_member_metadata(values))
            else:
                values._take(size)  # noqa: SLF001 (an unknown tag is skipped, as Kafka does)
        return record
    if kind is RecordType.TARGET_ASSIGNMENT_METADATA:
        epoch_record = TargetAssignmentEpochRecord(group_id, values.int32())
        values.skip_tagged_fields()
        return epoch_record
    if kind is RecordType.TARGET_ASSIGNMENT_MEMBER:
        target = TargetAssignmentRecord(group_id, member_id, values.partitions())
        values.skip_tagged_fields()
        return target
    current = CurrentAssignmentRecord(group_id, member_id, member_epoch=values.int32(),
                                      previous_member_epoch=values.int32(), state=values.int8(),
                                      assigned=values.partitions(), pending_revocation=values.partitions())
    values.skip_tagged_fields()
    return current
