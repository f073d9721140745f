"""Hand-packed encoders for hot fixed-shape messages (the Heartbeat response on the server, the Heartbeat
request in clients), and a hand reader of the Heartbeat v4 request (the server's hottest request).

kio's writer is pure Python and costs ~7 µs per response, the largest cost on the heartbeat path
(/work/shared/perf-notes.md); a struct pack costs ~0.15 µs. Tests compare every version byte for byte with kio.

HeartbeatResponse layouts (after the int32 size prefix and the int32 correlation id):
- v0:    error_code int16                                          (response header v0)
- v1–v3: throttle_time_ms int32, error_code int16                  (response header v0)
- v4:    0 (header tags), throttle_time_ms int32, error_code int16, 0 (body tags)   (flexible)
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from protocol.group_fastpath import (
    _array_count,
    _frame,
    _header,
    _length,
    _no_tags,
    _NotUsual,
    _nullable_string,
    _put_string,
    _string,
    uvarint,
)

_V0 = struct.Struct(">iih")
_V1_TO_V3 = struct.Struct(">iiih")
_V4 = struct.Struct(">iiBihB")
_HEADER = struct.Struct(">hhi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_CORRELATION_AND_CLIENT_ID_LENGTH = struct.Struct(">ih")
_V4_SIZE = _V4.size - 4
HEARTBEAT_V4_PREFIX = b"\x00\x0c\x00\x04"  # api_key 12, api_version 4


def pack_heartbeat_response(version: int, correlation_id: int, error_code: int, throttle_time_ms: int = 0) -> bytes:
    if version >= 4:
        return _V4.pack(_V4.size - 4, correlation_id, 0, throttle_time_ms, error_code, 0)
    if version >= 1:
        return _V1_TO_V3.pack(_V1_TO_V3.size - 4, correlation_id, throttle_time_ms, error_code)
    return _V0.pack(_V0.size - 4, correlation_id, error_code)


def pack_heartbeat_v4_response(correlation_id: int, error_code: int) -> bytes:
    """`pack_heartbeat_response(4, correlation_id, error_code)` without the version branches (the server's fast path)."""
    return _V4.pack(_V4_SIZE, correlation_id, 0, 0, error_code, 0)


def _legacy_string(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff"
    raw = value.encode()
    return _INT16.pack(len(raw)) + raw


def _compact_string(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode()
    return unsigned_varint(len(raw) + 1) + raw


def unsigned_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def pack_heartbeat_request(version: int, correlation_id: int, client_id: str | None, group_id: str,
                           generation_id: int, member_id: str, group_instance_id: str | None = None) -> bytes:
    """A complete Heartbeat request frame (for clients and load generators: kio's writer costs ~7 µs).

    v0–v2: group_id, generation_id, member_id (int16-length strings), header v1;
    v3: + nullable group_instance_id; v4: compact strings, tag sections, header v2.
    """
    header = _HEADER.pack(12, version, correlation_id) + _legacy_string(client_id)
    if version >= 4:
        body = (b"\x00" + _compact_string(group_id) + _INT32.pack(generation_id) + _compact_string(member_id)
                + _compact_string(group_instance_id) + b"\x00")
    else:
        body = _legacy_string(group_id) + _INT32.pack(generation_id) + _legacy_string(member_id)
        if version >= 3:
            body += _legacy_string(group_instance_id)
    payload = header + body
    return _INT32.pack(len(payload)) + payload


def read_heartbeat_v4_request(frame: bytes) -> tuple[int, str | None, str, int, str, str | None] | None:
    """(correlation_id, client_id, group_id, generation_id, member_id, group_instance_id) of a Heartbeat v4 request
    frame (without its size prefix) in its usual shape, else None: then the general decoder reads it (and
    reports whatever is wrong with it), so this reader never has to reject anything itself.

    The usual shape: no tagged fields in header or body, strings shorter than 127 bytes (one-byte lengths).
    Worth it because the general path builds a kio object, a header and a request tuple per heartbeat: this
    costs about 1.3 µs less of the ~5 µs our server spends in Python per heartbeat. Reads only within `frame`
    (slices and unpack_from are bounded; a short frame raises and gives None). Bytes after the body are
    ignored, as the general decoder does. The group and member ids are read inline (what `_short_compact_string`
    does): a function call each is a tenth of this reader's time."""
    try:
        correlation_id, length = _CORRELATION_AND_CLIENT_ID_LENGTH.unpack_from(frame, 4)
        offset = 10
        frame_length = len(frame)
        if length >= 0:
            offset += length
            if offset > frame_length:
                return None
            client_id: str | None = frame[10:offset].decode()
        elif length == -1:
            client_id = None
        else:
            return None
        if frame[offset]:  # header tagged fields
            return None
        size = frame[offset + 1]  # group_id: a compact string, its length + 1 in one byte
        end = offset + 1 + size
        if size == 0 or size >= 0x80 or end > frame_length:
            return None
        group_id = frame[offset + 2:end].decode()
        (generation_id,) = _INT32.unpack_from(frame, end)
        offset = end + 4
        size = frame[offset]  # member_id, the same way
        end = offset + size
        if size == 0 or size >= 0x80 or end > frame_length:
            return None
        member_id = frame[offset + 1:end].decode()
        if frame[end] == 0:  # null group_instance_id
            group_instance_id, offset = None, end + 1
        else:
            group_instance_id, offset = _short_compact_string(frame, end)
        if frame[offset]:  # body tagged fields
            return None
    except (IndexError, struct.error, UnicodeDecodeError, _NotUsual):
        return None
    return correlation_id, client_id, group_id, generation_id, member_id, group_instance_id


def _short_compact_string(frame: bytes, offset: int) -> tuple[str, int]:
    """A non-null compact string whose length fits the one-byte varint; the offset after it."""
    size = frame[offset]
    end = offset + size
    if size == 0 or size >= 0x80 or end > len(frame):
        raise _NotUsual
    return frame[offset + 1:end].decode(), end


# ---------------------------------------------------------------------------------------------- ConsumerGroupHeartbeat
# API 68 v0–v1 (flexible): request header v2, response header v1. The general codec costs ~8 µs to read a
# steady-state heartbeat and ~15 µs to build and write its answer; these cost a few slices and struct packs.

CONSUMER_GROUP_HEARTBEAT_API_KEY = b"\x00\x44"
_ONE_MS = datetime.timedelta(milliseconds=1)
_NIL_UUID = uuid.UUID(int=0)
_EPOCH_INTERVAL = struct.Struct(">ii")
_THROTTLE_ERROR = struct.Struct(">ih")


_NO_TIMEOUT = -1 * _ONE_MS
# The steady heartbeat's fields after the member epoch, every one null (unchanged) per version: instance id, rack
# id, rebalance timeout -1, topic names, (v1: regex,) assignor, owned partitions, then no tags. One comparison.
_STEADY_TAILS = (b"\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00\x00")


class OwnedTopicPartitions(NamedTuple):
    topic_id: uuid.UUID | None
    partitions: tuple[int, ...]


class ConsumerGroupHeartbeatFields(NamedTuple):
    """A ConsumerGroupHeartbeat request's fields under the names (and types) of kio's payload, which the handler
    reads (coordinator/server/handlers/consumer_group_heartbeat.py)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout: datetime.timedelta
    subscribed_topic_names: tuple[str, ...] | None
    subscribed_topic_regex: str | None  # v1+; None for v0
    server_assignor: str | None
    topic_partitions: tuple[OwnedTopicPartitions, ...] | None


def read_consumer_group_heartbeat(frame: bytes) -> tuple[int, int, str | None, ConsumerGroupHeartbeatFields] | None:
    """(api_version, correlation_id, client_id, fields) of a ConsumerGroupHeartbeat v0/v1 request (frame without
    its size prefix) in its usual shape, else None: then the general decoder reads it and reports whatever is
    wrong with it. The usual shape: no tagged fields, every length within the frame (protocol.group_fastpath's
    bounded readers), varints of at most five bytes."""
    try:
        version, correlation_id, client_id, _, offset = _header(frame, 68, 0)
        if version > 1:
            return None
        group_id, offset = _string(frame, offset, True)
        member_id, offset = _string(frame, offset, True)
        (member_epoch,) = _INT32.unpack_from(frame, offset)
        steady = _STEADY_TAILS[version]
        if frame[offset + 4:offset + 4 + len(steady)] == steady:
            return version, correlation_id, client_id, ConsumerGroupHeartbeatFields(
                group_id, member_id, member_epoch, None, None, _NO_TIMEOUT, None, None, None, None)
        instance_id, offset = _nullable_string(frame, offset + 4, True)
        rack_id, offset = _nullable_string(frame, offset, True)
        (rebalance_timeout_ms,) = _INT32.unpack_from(frame, offset)
        names, offset = _nullable_names(frame, offset + 4)
        regex = None
        if version >= 1:
            regex, offset = _nullable_string(frame, offset, True)
        server_assignor, offset = _nullable_string(frame, offset, True)
        owned, offset = _nullable_owned(frame, offset)
        _no_tags(frame, offset)
    except (IndexError, struct.error, UnicodeDecodeError, _NotUsual):
        return None
    return version, correlation_id, client_id, ConsumerGroupHeartbeatFields(
        group_id, member_id, member_epoch, instance_id, rack_id, rebalance_timeout_ms * _ONE_MS, names, regex,
        server_assignor, owned)


def _nullable_names(frame: bytes, offset: int) -> tuple[tuple[str, ...] | None, int]:
    if frame[offset] == 0:
        return None, offset + 1
    count, offset = _array_count(frame, offset, True)
    names = []
    for _ in range(count):
        name, offset = _string(frame, offset, True)
        names.append(name)
    return tuple(names), offset


def _nullable_owned(frame: bytes, offset: int) -> tuple[tuple[OwnedTopicPartitions, ...] | None, int]:
    if frame[offset] == 0:
        return None, offset + 1
    count, offset = _array_count(frame, offset, True)
    owned = []
    for _ in range(count):
        end = offset + 16
        if end > len(frame):
            raise _NotUsual
        topic_id = uuid.UUID(bytes=frame[offset:end])
        partition_count, offset = _length(frame, end, True, _INT32)
        if partition_count < 0 or 4 * partition_count > len(frame) - offset:
            raise _NotUsual
        partitions = struct.unpack_from(f">{partition_count}i", frame, offset)
        offset = _no_tags(frame, offset + 4 * partition_count)
        owned.append(OwnedTopicPartitions(None if topic_id == _NIL_UUID else topic_id, partitions))
    return tuple(owned), offset


def pack_consumer_group_heartbeat_response(correlation_id: int, error_code: int, error_message: str | None,
                                           member_id: str | None, member_epoch: int, heartbeat_interval_ms: int,
                                           assignment: Mapping[uuid.UUID, Sequence[int]] | None,
                                           throttle_time_ms: int = 0) -> bytes:
    """A complete ConsumerGroupHeartbeat v0/v1 response frame (the two versions' responses are the same)."""
    parts = [_THROTTLE_ERROR.pack(throttle_time_ms, error_code)]
    _put_string(parts, error_message, True)
    _put_string(parts, member_id, True)
    parts.append(_EPOCH_INTERVAL.pack(member_epoch, heartbeat_interval_ms))
    if assignment is None:
        parts.append(b"\xff\x00")  # null struct marker (-1), body tags
    else:
        parts.append(b"\x01")  # present struct marker
        parts.append(uvarint(len(assignment) + 1))
        for topic_id, partitions in assignment.items():
            parts.append(topic_id.bytes)
            parts.append(uvarint(len(partitions) + 1))
            parts.append(struct.pack(f">{len(partitions)}i", *partitions))
            parts.append(b"\x00")  # topic tags
        parts.append(b"\x00\x00")  # assignment tags, body tags
    return _frame(parts, correlation_id, True)
