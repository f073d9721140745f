"""The state topic's records, in Kafka's own `__consumer_offsets` formats (docs/state-topic.md).

Key and value are each a 2-byte big-endian schema version followed by the struct of that version, as defined by
Kafka's `GroupMetadataKey/Value` and `OffsetCommitKey/Value` JSON schemas. The key version says which record it
is: 0 and 1 are offset commits, 2 is group metadata; 3-8 and 16 are the consumer groups' records
(consumer_records.py); -2 is ours alone, a tombstone that opens a write's transaction ahead of it
(`OPEN_AHEAD_KEY`, skipped quietly); anything else decodes to `UnknownKey`, which the loader skips with a warning. A null value is a tombstone. Values
decode to the group core's own records (coordinator/group/records.py: GroupRecord, MemberRecord, OffsetRecord,
the same fields as Kafka's schemas), and `encode` takes the shard's typed records (`GroupMetadataRecord`,
`OffsetCommitRecord`), so nothing converts between the core and the codec.

Written versions are Kafka's: OffsetCommitKey v1, GroupMetadataKey v2, GroupRecord v3, OffsetRecord v3
(v1 when an expire timestamp is present, the only version with that field). Every version 0–4 is readable;
v4 is the first flexible version (compact lengths, tagged fields).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Union

from coordinator.storage import consumer_records
from coordinator.group.modern.records import CONSUMER_GROUP_RECORD_CLASSES
from coordinator.group.records import (GroupMetadataRecord, GroupRecord, MemberRecord, OffsetCommitRecord,
                                      OffsetRecord, Record)
from coordinator.storage._wire import Reader, RecordFormatError, Writer

__all__ = [
    "RecordFormatError", "OffsetCommitKey", "GroupMetadataKey", "UnknownKey", "RecordKey",
    "GroupRecord", "MemberRecord", "OffsetRecord",
    "StateRecord", "OPEN_AHEAD_KEY", "OPEN_AHEAD_KEY_VERSION",
    "encode_key", "decode_key", "encode_offset_commit_value", "decode_offset_commit_value",
    "encode_group_metadata_value", "encode_group_metadata_value_general", "decode_group_metadata_value",
    "offset_commit_value_version",
    "decode_record", "encode_record", "encode",
]

OFFSET_COMMIT_KEY_VERSIONS = (0, 1)
OFFSET_COMMIT_KEY_WRITE_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
VALUE_VERSIONS = range(0, 5)  # both value schemas: validVersions 0-4
FIRST_FLEXIBLE_VALUE_VERSION = 4
GROUP_METADATA_VALUE_WRITE_VERSION = 3
OFFSET_COMMIT_VALUE_WRITE_VERSION = 3
OFFSET_COMMIT_VALUE_EXPIRE_VERSION = 1  # the only version that carries expireTimestamp
# Not a Kafka record type (those are non-negative): a tombstone produced into a partition to register it with a
# transaction before the write it is opened for (transactions.py, `open_ahead`). Readers skip it; compaction
# removes it. Key only: the version.
OPEN_AHEAD_KEY_VERSION = -2
OPEN_AHEAD_KEY = struct.pack(">h", OPEN_AHEAD_KEY_VERSION)
_INT16_MAX = 0x7FFF
_pack = struct.pack


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class UnknownKey:
    """A key whose version we do not know (e.g. Kafka 4.x consumer-group records); `raw` is the whole key."""

    version: int
    raw: bytes


RecordKey = Union[OffsetCommitKey, GroupMetadataKey, UnknownKey]


@dataclass(frozen=True, slots=True)
class StateRecord:
    """One decoded state-topic record; `value is None` is a tombstone (and always so for `UnknownKey`)."""

    key: RecordKey
    value: OffsetRecord | GroupRecord | None


# ---- keys ----------------------------------------------------------------------------------------------------

def encode_key(key: OffsetCommitKey | GroupMetadataKey) -> bytes:
    if type(key) is OffsetCommitKey:  # the hot path (every committed partition): one pack call
        group, topic = key.group.encode(), key.topic.encode()
        if len(group) <= _INT16_MAX and len(topic) <= _INT16_MAX:
            return _pack(f">hh{len(group)}sh{len(topic)}si", OFFSET_COMMIT_KEY_WRITE_VERSION, len(group), group,
                         len(topic), topic, key.partition)
    out = Writer()
    if isinstance(key, OffsetCommitKey):
        out.int16(OFFSET_COMMIT_KEY_WRITE_VERSION)
        out.string(key.group)
        out.string(key.topic)
        out.int32(key.partition)
    elif isinstance(key, GroupMetadataKey):
        out.int16(GROUP_METADATA_KEY_VERSION)
        out.string(key.group)
    else:
        raise TypeError(f"cannot encode key {key!r}")
    return out.getvalue()


def decode_key(data: bytes) -> RecordKey:
    reader = Reader(data)
    version = reader.int16()
    if version in OFFSET_COMMIT_KEY_VERSIONS:
        key: RecordKey = OffsetCommitKey(reader.string(), reader.string(), reader.int32())
    elif version == GROUP_METADATA_KEY_VERSION:
        key = GroupMetadataKey(reader.string())
    else:
        return UnknownKey(version, bytes(data))
    reader.expect_end()
    return key


# ---- offset commit value ---------------------------------------------------------------------------------------

def offset_commit_value_version(value: OffsetRecord) -> int:
    """Kafka's choice: v1 when an expire timestamp must be kept (v2+ dropped the field), else v3."""
    if value.expire_timestamp_ms is not None:
        return OFFSET_COMMIT_VALUE_EXPIRE_VERSION
    return OFFSET_COMMIT_VALUE_WRITE_VERSION


def encode_offset_commit_value(value: OffsetRecord, version: int | None = None) -> bytes:
    """Encode at `version` (default: Kafka's written version); fields the version lacks are dropped."""
    version = offset_commit_value_version(value) if version is None else version
    if version == OFFSET_COMMIT_VALUE_WRITE_VERSION:  # the hot path: one pack call
        metadata = value.metadata.encode()
        if len(metadata) <= _INT16_MAX:
            return _pack(f">hqih{len(metadata)}sq", version, value.offset, value.leader_epoch, len(metadata),
                         metadata, value.commit_timestamp_ms)
    _check_value_version(version, "OffsetCommitValue")
    out = Writer(flexible=version >= FIRST_FLEXIBLE_VALUE_VERSION)
    out.int16(version)
    out.int64(value.offset)
    if version >= 3:
        out.int32(value.leader_epoch)
    out.string(value.metadata)
    out.int64(value.commit_timestamp_ms)
    if version == 1:
        out.int64(-1 if value.expire_timestamp_ms is None else value.expire_timestamp_ms)
    out.tagged_fields()
    return out.getvalue()


def decode_offset_commit_value(data: bytes) -> OffsetRecord:
    reader = Reader(data)
    version = reader.int16()
    _check_value_version(version, "OffsetCommitValue")
    reader.flexible = version >= FIRST_FLEXIBLE_VALUE_VERSION
    offset = reader.int64()
    leader_epoch = reader.int32() if version >= 3 else -1
    metadata = reader.string()
    commit_timestamp_ms = reader.int64()
    expire_timestamp_ms = reader.int64() if version == 1 else -1
    reader.skip_tagged_fields()
    reader.expect_end()
    return OffsetRecord(offset, leader_epoch, metadata, commit_timestamp_ms,
                        None if expire_timestamp_ms == -1 else expire_timestamp_ms)


# ---- group metadata value --------------------------------------------------------------------------------------

def encode_group_metadata_value(value: GroupRecord,
                                version: int = GROUP_METADATA_VALUE_WRITE_VERSION) -> bytes:
    """Encode at `version` (default: v3, Kafka's written version); fields the version lacks are dropped."""
    if version == GROUP_METADATA_VALUE_WRITE_VERSION:  # every rebalance writes one: members from a cache
        encoded = _group_metadata_value_v3(value)
        if encoded is not None:
            return encoded
    return encode_group_metadata_value_general(value, version)


def encode_group_metadata_value_general(value: GroupRecord, version: int) -> bytes:
    """The schema-driven writer of every version; `encode_group_metadata_value`'s v3 path gives the same bytes
    (the property tests compare them) and leaves to this one whatever it does not take."""
    _check_value_version(version, "GroupMetadataValue")
    out = Writer(flexible=version >= FIRST_FLEXIBLE_VALUE_VERSION)
    out.int16(version)
    out.string(value.protocol_type)
    out.int32(value.generation)
    out.string(value.protocol, nullable=True)
    out.string(value.leader, nullable=True)
    if version >= 2:
        out.int64(value.current_state_timestamp_ms)
    out.array_length(len(value.members))
    for member in value.members:
        _encode_member(out, member, version)
    out.tagged_fields()
    return out.getvalue()


def _encode_member(out: Writer, member: MemberRecord, version: int) -> None:
    out.string(member.member_id)
    if version >= 3:
        out.string(member.group_instance_id, nullable=True)
    out.string(member.client_id)
    out.string(member.client_host)
    if version >= 1:
        out.int32(member.rebalance_timeout_ms)
    out.int32(member.session_timeout_ms)
    out.bytes_(member.subscription)
    out.bytes_(member.assignment)
    out.tagged_fields()


# A member's fields before its subscription (id, instance id, client id, host, both timeouts) change only when it
# rejoins differently, so their v3 bytes are kept from one group write to the next: a rebalance of n members then
# encodes only the members' subscriptions and assignments. Bounded: cleared whole when full.
MemberHeadKey = tuple[str, Union[str, None], str, str, int, int]
_MEMBER_HEADS: dict[MemberHeadKey, bytes] = {}
MEMBER_HEADS_MAX = 50_000
_pack_i16 = struct.Struct(">h").pack
_pack_i32 = struct.Struct(">i").pack
_pack_timeouts = struct.Struct(">ii").pack
_NULL_STRING = _pack_i16(-1)


def _group_metadata_value_v3(value: GroupRecord) -> bytes | None:
    """GroupMetadataValue v3 (not flexible: no tagged fields); None for anything the general writer must judge
    (a null where the schema has none, a string over the int16 length, a number out of its type's range)."""
    out = Writer()
    out.int16(GROUP_METADATA_VALUE_WRITE_VERSION)
    out.string(value.protocol_type)
    out.int32(value.generation)
    out.string(value.protocol, nullable=True)
    out.string(value.leader, nullable=True)
    out.int64(value.current_state_timestamp_ms)
    out.array_length(len(value.members))
    parts = [out.getvalue()]
    append = parts.append
    heads = _MEMBER_HEADS
    for member in value.members:
        key = (member.member_id, member.group_instance_id, member.client_id, member.client_host,
               member.rebalance_timeout_ms, member.session_timeout_ms)
        head = heads.get(key)
        if head is None or type(key[4]) is not int or type(key[5]) is not int:  # 1.0 == 1: not a hit
            head = _member_head_v3(*key)
            if head is None:
                return None
            if len(heads) >= MEMBER_HEADS_MAX:
                heads.clear()
            heads[key] = head
        subscription, assignment = member.subscription, member.assignment
        append(head)
        append(_pack_i32(len(subscription)))
        append(subscription)
        append(_pack_i32(len(assignment)))
        append(assignment)
    return b"".join(parts)


def _member_head_v3(member_id: str, group_instance_id: str | None, client_id: str, client_host: str,
                    rebalance_timeout_ms: int, session_timeout_ms: int) -> bytes | None:
    if type(rebalance_timeout_ms) is not int or type(session_timeout_ms) is not int:
        return None  # a float or bool: the general writer's call
    try:
        parts = [_short_string(member_id),
                 _NULL_STRING if group_instance_id is None else _short_string(group_instance_id),
                 _short_string(client_id), _short_string(client_host),
                 _pack_timeouts(rebalance_timeout_ms, session_timeout_ms)]
    except (struct.error, UnicodeEncodeError, AttributeError, _TooLong):
        return None
    return b"".join(parts)


class _TooLong(Exception):
    pass


def _short_string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > _INT16_MAX:
        raise _TooLong
    return _pack_i16(len(data)) + data


def decode_group_metadata_value(data: bytes) -> GroupRecord:
    reader = Reader(data)
    version = reader.int16()
    _check_value_version(version, "GroupMetadataValue")
    if version < FIRST_FLEXIBLE_VALUE_VERSION:
        return _decode_classic_group_value(data, version)
    reader.flexible = version >= FIRST_FLEXIBLE_VALUE_VERSION
    protocol_type = reader.string()
    generation = reader.int32()
    protocol = reader.nullable_string()
    leader = reader.nullable_string()
    current_state_timestamp_ms = reader.int64() if version >= 2 else -1
    members = [_decode_member(reader, version) for _ in range(reader.array_length())]
    reader.skip_tagged_fields()
    reader.expect_end()
    return GroupRecord(protocol_type, generation, protocol, leader, current_state_timestamp_ms, members)


def _decode_member(reader: Reader, version: int) -> MemberRecord:
    member_id = reader.string()
    group_instance_id = reader.nullable_string() if version >= 3 else None
    client_id = reader.string()
    client_host = reader.string()
    rebalance_timeout_ms = reader.int32() if version >= 1 else None
    session_timeout_ms = reader.int32()
    subscription = reader.bytes_()
    assignment = reader.bytes_()
    reader.skip_tagged_fields()
    if rebalance_timeout_ms is None:
        rebalance_timeout_ms = session_timeout_ms
    return MemberRecord(member_id, group_instance_id, client_id, client_host, rebalance_timeout_ms,
                        session_timeout_ms, subscription, assignment)


_unpack_i16 = struct.Struct(">h").unpack_from
_unpack_i32 = struct.Struct(">i").unpack_from
_unpack_i64 = struct.Struct(">q").unpack_from


def _decode_classic_group_value(data: bytes, version: int) -> GroupRecord:
    """Versions 0-3 without the Reader's per-field method calls: loading 100k groups spends most of its time
    here. Same result as the generic path (the round-trip tests run both); any inconsistency in lengths ends
    as RecordFormatError through the final position check or a failed unpack."""
    try:
        value, end = _classic_group_value(data, version)
    except (struct.error, UnicodeDecodeError) as exc:
        raise RecordFormatError(f"malformed GroupMetadataValue v{version}: {exc}") from exc
    if end != len(data):
        raise RecordFormatError(f"GroupMetadataValue v{version}: {len(data) - end} bytes left over or missing")
    return value


def _classic_group_value(data: bytes, version: int) -> tuple[GroupRecord, int]:
    def text(pos: int, nullable: bool = False) -> tuple[str | None, int]:
        (length,) = _unpack_i16(data, pos)
        pos += 2
        if length < 0:
            if nullable:
                return None, pos
            raise RecordFormatError(f"null in a non-nullable string at byte {pos}")
        if pos + length > len(data):
            raise RecordFormatError(f"string runs past the end at byte {pos}")
        return data[pos:pos + length].decode(), pos + length

    def blob(pos: int) -> tuple[bytes, int]:
        (length,) = _unpack_i32(data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise RecordFormatError(f"bad bytes length {length} at byte {pos}")
        return bytes(data[pos:pos + length]), pos + length

    protocol_type, pos = text(2)
    (generation,) = _unpack_i32(data, pos)
    protocol, pos = text(pos + 4, nullable=True)
    leader, pos = text(pos, nullable=True)
    timestamp_ms = -1
    if version >= 2:
        (timestamp_ms,) = _unpack_i64(data, pos)
        pos += 8
    (count,) = _unpack_i32(data, pos)
    pos += 4
    if count < 0:
        raise RecordFormatError(f"null members array at byte {pos}")
    members = []
    for _ in range(count):
        member_id, pos = text(pos)
        instance_id = None
        if version >= 3:
            instance_id, pos = text(pos, nullable=True)
        client_id, pos = text(pos)
        client_host, pos = text(pos)
        rebalance_ms = None
        if version >= 1:
            (rebalance_ms,) = _unpack_i32(data, pos)
            pos += 4
        (session_ms,) = _unpack_i32(data, pos)
        subscription, pos = blob(pos + 4)
        assignment, pos = blob(pos)
        members.append(MemberRecord(member_id, instance_id, client_id, client_host,  # type: ignore[arg-type]
                                    session_ms if rebalance_ms is None else rebalance_ms, session_ms,
                                    subscription, assignment))
    return GroupRecord(protocol_type, generation, protocol, leader, timestamp_ms,  # type: ignore[arg-type]
                       members), pos


# ---- whole records ---------------------------------------------------------------------------------------------

def encode_record(key: OffsetCommitKey | GroupMetadataKey,
                  value: OffsetRecord | GroupRecord | None) -> tuple[bytes, bytes | None]:
    """(key bytes, value bytes or None for a tombstone), each in its written version."""
    if value is None:
        return encode_key(key), None
    if isinstance(key, OffsetCommitKey) and isinstance(value, OffsetRecord):
        return encode_key(key), encode_offset_commit_value(value)
    if isinstance(key, GroupMetadataKey) and isinstance(value, GroupRecord):
        return encode_key(key), encode_group_metadata_value(value)
    raise TypeError(f"value {type(value).__name__} does not belong to key {type(key).__name__}")


def encode(record: Record) -> tuple[bytes, bytes | None]:
    """A shard's record as (key bytes, value bytes or None for a tombstone), each in its written version."""
    if type(record) is OffsetCommitRecord:
        key = encode_key(OffsetCommitKey(record.group_id, record.topic, record.partition))
        return key, None if record.value is None else encode_offset_commit_value(record.value)
    if type(record) is GroupMetadataRecord:
        key = encode_key(GroupMetadataKey(record.group_id))
        return key, None if record.value is None else encode_group_metadata_value(record.value)
    if isinstance(record, CONSUMER_GROUP_RECORD_CLASSES):  # KIP-848 (coordinator/storage/consumer_records.py)
        return consumer_records.encode_key(record), consumer_records.encode_value(record)
    raise TypeError(f"no state-topic encoding for {type(record).__name__}")


def decode_record(key_bytes: bytes, value_bytes: bytes | None) -> StateRecord:
    """Decode one state-topic record. Raises RecordFormatError on malformed bytes or an unknown value version."""
    key = decode_key(key_bytes)
    if value_bytes is None or isinstance(key, UnknownKey):
        return StateRecord(key, None)
    if isinstance(key, OffsetCommitKey):
        return StateRecord(key, decode_offset_commit_value(value_bytes))
    return StateRecord(key, decode_group_metadata_value(value_bytes))


def _check_value_version(version: int, schema: str) -> None:
    if version not in VALUE_VERSIONS:
        raise RecordFormatError(f"unknown {schema} version {version} (known: 0-4)")
