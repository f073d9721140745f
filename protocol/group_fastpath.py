"""Hand readers and writers of the rebalance's messages, JoinGroup (11) and SyncGroup (14), every version the
server serves, in their usual shapes.

A 1,000-member rebalance is 2,000 of these requests and responses, and the leader's JoinGroup response carries
every member's metadata (the SyncGroup request every member's assignment). Through kio each request costs a
generated reader building frozen dataclasses and each response kio's pure-Python writer; by hand it is a few
slices and struct packs, and member metadata goes back out as the bytes it arrived in.

Readers: `read_join_group(frame)` / `read_sync_group(frame)` take a request frame (size prefix removed) and
return (api_version, correlation_id, client_id, fields), or None when the frame is not in the usual shape: no
tagged fields anywhere, non-null where the schema says non-null, every length inside the frame. Then the general
decoder (protocol.codec, through protocol.tolerant) reads it and reports whatever is wrong with it, so these
readers never reject anything themselves and never read past the frame: every length is checked against the
bytes left before anything is sliced, array counts included (each element takes at least one byte), and varints
longer than five bytes are refused. Bytes after the body are ignored, as the general decoder does. Tests check
both against kio for every version (tests/unit/test_group_fastpath.py, hypothesis).

Writers: complete response frames (size prefix included), byte for byte what kio writes for the same values.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterable
from typing import NamedTuple

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_TWO_INT32 = struct.Struct(">ii")
_HEADER = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_SIZE_CORRELATION = struct.Struct(">ii")
_THROTTLE_ERROR = struct.Struct(">ih")
_ERROR_GENERATION = struct.Struct(">hi")
_THROTTLE_ERROR_GENERATION = struct.Struct(">ihi")
_JOIN_GROUP, _SYNC_GROUP = 11, 14
_JOIN_FLEXIBLE_FROM, _SYNC_FLEXIBLE_FROM = 6, 4
_ONE_MS = datetime.timedelta(milliseconds=1)
_SMALL_UVARINTS = [bytes((n,)) for n in range(128)]
# A NamedTuple's own constructor is a generated Python function (~0.5 µs on this machine); tuple.__new__ builds the
# same object in C (~0.2 µs). Per request on the hot path only, with every field given in the class's order
# (tests/unit/test_group_fastpath.py compares the two).
new_tuple = tuple.__new__


class JoinGroupFields(NamedTuple):
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int | None  # None below v1 (the request has none)
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata) in the client's order
    reason: str | None


class SyncGroupFields(NamedTuple):
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: list[tuple[str, bytes]]  # (member_id, assignment)


class _NotUsual(Exception):
    pass


# ---------------------------------------------------------------------------------------------- reading


def _uvarint(frame: bytes, offset: int) -> tuple[int, int]:
    byte = frame[offset]
    if byte < 0x80:
        return byte, offset + 1
    value, shift = byte & 0x7F, 7
    while True:
        offset += 1
        byte = frame[offset]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset + 1
        shift += 7
        if shift > 28:  # a sixth byte: not a 32-bit varint
            raise _NotUsual


def _length(frame: bytes, offset: int, flexible: bool, fixed: struct.Struct) -> tuple[int, int]:
    """A length prefix: compact (unsigned varint of length + 1) or `fixed` (int16/int32); -1 is null."""
    if flexible:
        size = frame[offset]
        if size < 0x80:  # a one-byte length: the usual case
            return size - 1, offset + 1
        size, offset = _uvarint(frame, offset)
        return size - 1, offset
    (size,) = fixed.unpack_from(frame, offset)
    return size, offset + fixed.size


def _string(frame: bytes, offset: int, flexible: bool) -> tuple[str, int]:
    """A non-null string (int16 length, or compact: unsigned varint length + 1)."""
    size, offset = _length(frame, offset, flexible, _INT16)
    end = offset + size
    if size < 0 or end > len(frame):
        raise _NotUsual
    return frame[offset:end].decode(), end


def _nullable_string(frame: bytes, offset: int, flexible: bool) -> tuple[str | None, int]:
    size, offset = _length(frame, offset, flexible, _INT16)
    if size == -1:
        return None, offset
    end = offset + size
    if size < 0 or end > len(frame):
        raise _NotUsual
    return frame[offset:end].decode(), end


def _bytes(frame: bytes, offset: int, flexible: bool) -> tuple[bytes, int]:
    """Non-null bytes (int32 length, or compact)."""
    size, offset = _length(frame, offset, flexible, _INT32)
    end = offset + size
    if size < 0 or end > len(frame):
        raise _NotUsual
    return frame[offset:end], end


def _array_count(frame: bytes, offset: int, flexible: bool) -> tuple[int, int]:
    """A non-null array's element count, refusing counts the frame cannot hold (each element takes a byte)."""
    count, offset = _length(frame, offset, flexible, _INT32)
    if count < 0 or count > len(frame) - offset:
        raise _NotUsual
    return count, offset


def _no_tags(frame: bytes, offset: int) -> int:
    if frame[offset]:
        raise _NotUsual
    return offset + 1


def _pairs(frame: bytes, offset: int, flexible: bool) -> tuple[list[tuple[str, bytes]], int]:
    """An array of (string, bytes) entries: JoinGroup's protocols, SyncGroup's assignments."""
    count, offset = _array_count(frame, offset, flexible)
    pairs = []
    for _ in range(count):
        name, offset = _string(frame, offset, flexible)
        value, offset = _bytes(frame, offset, flexible)
        if flexible:
            offset = _no_tags(frame, offset)
        pairs.append((name, value))
    return pairs, offset


def _header(frame: bytes, api_key: int, flexible_from: int) -> tuple[int, int, str | None, bool, int]:
    """(version, correlation_id, client_id, flexible, offset of the body) of a request header v1/v2."""
    key, version, correlation_id, client_id_length = _HEADER.unpack_from(frame)
    if key != api_key:
        raise _NotUsual
    offset = _HEADER.size
    if client_id_length >= 0:
        end = offset + client_id_length
        if end > len(frame):
            raise _NotUsual
        client_id: str | None = frame[offset:end].decode()
        offset = end
    elif client_id_length == -1:
        client_id = None
    else:
        raise _NotUsual
    flexible = version >= flexible_from
    if flexible:
        offset = _no_tags(frame, offset)
    return version, correlation_id, client_id, flexible, offset


def _compact_string(frame: bytes, offset: int) -> tuple[str | None, int]:
    """A compact (nullable) string of a flexible version: unsigned varint length + 1 (0: null), the bytes.
    One call a field on the hot path; the caller refuses a null where the schema has none."""
    size = frame[offset]
    if size < 0x80:  # a one-byte length: the usual case
        offset += 1
    else:
        size, offset = _uvarint(frame, offset)
    if not size:
        return None, offset
    end = offset + size - 1
    if end > len(frame):
        raise _NotUsual
    return frame[offset:end].decode(), end


def _compact_pairs(frame: bytes, offset: int) -> tuple[list[tuple[str, bytes]], int]:
    """`_pairs` of a flexible version, its fields read inline: JoinGroup's protocols, SyncGroup's assignments."""
    count = frame[offset]
    if count < 0x80:
        offset += 1
    else:
        count, offset = _uvarint(frame, offset)
    count -= 1
    frame_size = len(frame)
    if count < 0 or count > frame_size - offset:
        raise _NotUsual
    pairs = []
    for _ in range(count):
        name, offset = _compact_string(frame, offset)
        size = frame[offset]
        if size < 0x80:
            offset += 1
        else:
            size, offset = _uvarint(frame, offset)
        end = offset + size - 1
        if name is None or not size or end >= frame_size or frame[end]:  # null, past the frame, or tagged fields
            raise _NotUsual
        pairs.append((name, frame[offset:end]))
        offset = end + 1
    return pairs, offset


def _read_join_group_flexible(frame: bytes, version: int, offset: int) -> JoinGroupFields:
    """The body of a JoinGroup v6–v9 (each field's length read inline: a rebalance reads one per member)."""
    group_id, offset = _compact_string(frame, offset)
    session_timeout_ms, rebalance_timeout_ms = _TWO_INT32.unpack_from(frame, offset)
    member_id, offset = _compact_string(frame, offset + 8)
    group_instance_id, offset = _compact_string(frame, offset)
    protocol_type, offset = _compact_string(frame, offset)
    if group_id is None or member_id is None or protocol_type is None:
        raise _NotUsual
    protocols, offset = _compact_pairs(frame, offset)
    reason = None
    if version >= 8:
        reason, offset = _compact_string(frame, offset)
    if frame[offset]:
        raise _NotUsual
    return new_tuple(JoinGroupFields, (group_id, session_timeout_ms, rebalance_timeout_ms, member_id,
                                       group_instance_id, protocol_type, protocols, reason))


def _read_sync_group_flexible(frame: bytes, version: int, offset: int) -> SyncGroupFields:
    """The body of a SyncGroup v4–v5."""
    group_id, offset = _compact_string(frame, offset)
    (generation_id,) = _INT32.unpack_from(frame, offset)
    member_id, offset = _compact_string(frame, offset + 4)
    group_instance_id, offset = _compact_string(frame, offset)
    protocol_type = protocol_name = None
    if version >= 5:
        protocol_type, offset = _compact_string(frame, offset)
        protocol_name, offset = _compact_string(frame, offset)
    if group_id is None or member_id is None:
        raise _NotUsual
    assignments, offset = _compact_pairs(frame, offset)
    if frame[offset]:
        raise _NotUsual
    return new_tuple(SyncGroupFields, (group_id, generation_id, member_id, group_instance_id, protocol_type,
                                       protocol_name, assignments))


def read_join_group(frame: bytes) -> tuple[int, int, str | None, JoinGroupFields] | None:
    """(api_version, correlation_id, client_id, fields) of a JoinGroup request v0–v9 in its usual shape, else
    None (the general decoder reads it then)."""
    try:
        version, correlation_id, client_id, flexible, offset = _header(frame, _JOIN_GROUP, _JOIN_FLEXIBLE_FROM)
        if not 0 <= version <= 9:
            return None
        if flexible:
            return version, correlation_id, client_id, _read_join_group_flexible(frame, version, offset)
        group_id, offset = _string(frame, offset, flexible)
        (session_timeout_ms,) = _INT32.unpack_from(frame, offset)
        offset += 4
        rebalance_timeout_ms = None
        if version >= 1:
            (rebalance_timeout_ms,) = _INT32.unpack_from(frame, offset)
            offset += 4
        member_id, offset = _string(frame, offset, flexible)
        group_instance_id = None
        if version >= 5:
            group_instance_id, offset = _nullable_string(frame, offset, flexible)
        protocol_type, offset = _string(frame, offset, flexible)
        protocols, offset = _pairs(frame, offset, flexible)
        reason = None
        if version >= 8:
            reason, offset = _nullable_string(frame, offset, flexible)
        if flexible:
            _no_tags(frame, offset)
    except (IndexError, struct.error, UnicodeDecodeError, _NotUsual):
        return None
    return version, correlation_id, client_id, JoinGroupFields(
        group_id, session_timeout_ms, rebalance_timeout_ms, member_id, group_instance_id, protocol_type, protocols,
        reason)


def read_sync_group(frame: bytes) -> tuple[int, int, str | None, SyncGroupFields] | None:
    """(api_version, correlation_id, client_id, fields) of a SyncGroup request v0–v5 in its usual shape, else
    None (the general decoder reads it then)."""
    try:
        version, correlation_id, client_id, flexible, offset = _header(frame, _SYNC_GROUP, _SYNC_FLEXIBLE_FROM)
        if not 0 <= version <= 5:
            return None
        if flexible:
            return version, correlation_id, client_id, _read_sync_group_flexible(frame, version, offset)
        group_id, offset = _string(frame, offset, flexible)
        (generation_id,) = _INT32.unpack_from(frame, offset)
        member_id, offset = _string(frame, offset + 4, flexible)
        group_instance_id = protocol_type = protocol_name = None
        if version >= 3:
            group_instance_id, offset = _nullable_string(frame, offset, flexible)
        if version >= 5:
            protocol_type, offset = _nullable_string(frame, offset, flexible)
            protocol_name, offset = _nullable_string(frame, offset, flexible)
        assignments, offset = _pairs(frame, offset, flexible)
        if flexible:
            _no_tags(frame, offset)
    except (IndexError, struct.error, UnicodeDecodeError, _NotUsual):
        return None
    return version, correlation_id, client_id, SyncGroupFields(
        group_id, generation_id, member_id, group_instance_id, protocol_type, protocol_name, assignments)


# ---------------------------------------------------------------------------------------------- writing


def uvarint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_UVARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _put_string(parts: list[bytes], value: str | None, flexible: bool) -> None:
    """A string, or null (length -1; compact: 0) when the field is nullable."""
    if value is None:
        parts.append(b"\x00" if flexible else b"\xff\xff")
        return
    raw = value.encode()
    parts.append(uvarint(len(raw) + 1) if flexible else _INT16.pack(len(raw)))
    parts.append(raw)


def _put_bytes(parts: list[bytes], value: bytes, flexible: bool) -> None:
    parts.append(uvarint(len(value) + 1) if flexible else _INT32.pack(len(value)))
    parts.append(value)


def _frame(parts: list[bytes], correlation_id: int, flexible: bool) -> bytes:
    """The body's parts behind a response header (v1, with its empty tag section, for flexible versions)."""
    body = b"".join(parts)
    if flexible:
        return _SIZE_CORRELATION.pack(len(body) + 5, correlation_id) + b"\x00" + body
    return _SIZE_CORRELATION.pack(len(body) + 4, correlation_id) + body


def pack_join_group_response(version: int, correlation_id: int, error_code: int, generation_id: int,
                             protocol_type: str | None, protocol_name: str | None, leader: str,
                             skip_assignment: bool, member_id: str,
                             members: Iterable[tuple[str, str | None, bytes]]) -> bytes:
    """A JoinGroup response frame. `members`: (member_id, group_instance_id, metadata). The caller applies
    Kafka's version rules to the values (protocol_name "" below v7, null from v7 when unknown); fields a
    version does not have are left out here (throttle time 0 from v2, protocol_type from v7, skip_assignment
    from v9, group_instance_id from v5)."""
    flexible = version >= _JOIN_FLEXIBLE_FROM
    if flexible and type(members) is list and not members:  # a follower's answer: every member's but the leader's
        head = _follower_head(version, error_code, generation_id, protocol_type, protocol_name, leader,
                              skip_assignment)
        raw = member_id.encode()
        size = len(raw) + 1
        length = _SMALL_UVARINTS[size] if size < 0x80 else uvarint(size)
        # size, correlation id, the header's and then (after the member id and the empty member array) the body's
        # empty tag sections
        return b"".join((_SIZE_CORRELATION.pack(len(head) + len(length) + size + 6, correlation_id), b"\x00", head,
                         length, raw, b"\x01\x00"))
    parts: list[bytes] = []
    if version >= 2:
        parts.append(_THROTTLE_ERROR_GENERATION.pack(0, error_code, generation_id))
    else:
        parts.append(_ERROR_GENERATION.pack(error_code, generation_id))
    if flexible:  # the fields every member's answer of a generation shares, packed once
        parts.append(_compact_strings((protocol_type, protocol_name, leader) if version >= 7
                                      else (protocol_name, leader)))
    else:
        if version >= 7:
            _put_string(parts, protocol_type, flexible)
        _put_string(parts, protocol_name, flexible)
        _put_string(parts, leader, flexible)
    if version >= 9:
        parts.append(b"\x01" if skip_assignment else b"\x00")
    _put_string(parts, member_id, flexible)
    if type(members) is not list:  # not isinstance(..., Sequence): an ABC check per response
        members = list(members)
    parts.append(uvarint(len(members) + 1) if flexible else _INT32.pack(len(members)))
    with_instance_id = version >= 5
    append = parts.append
    for entry_member_id, group_instance_id, metadata in members:
        raw = entry_member_id.encode()
        if flexible:
            append(uvarint(len(raw) + 1))
            append(raw)
            if group_instance_id is None:
                append(b"\x00")
            else:
                _put_string(parts, group_instance_id, True)
            append(uvarint(len(metadata) + 1))
            append(metadata)
            append(b"\x00")
        else:
            append(_INT16.pack(len(raw)))
            append(raw)
            if with_instance_id:
                _put_string(parts, group_instance_id, False)
            append(_INT32.pack(len(metadata)))
            append(metadata)
    if flexible:
        parts.append(b"\x00")
    return _frame(parts, correlation_id, flexible)


_FOLLOWER_HEADS: dict[tuple[int, int, int, str | None, str | None, str, bool], bytes] = {}


def _follower_head(version: int, error_code: int, generation_id: int, protocol_type: str | None,
                   protocol_name: str | None, leader: str, skip_assignment: bool) -> bytes:
    """A flexible JoinGroup answer's body up to the member id (throttle time, error, generation, the protocol's
    names, the leader, skip_assignment), packed once per generation: a rebalance's followers share it."""
    key = (version, int(error_code), generation_id, protocol_type, protocol_name, leader, skip_assignment)
    head = _FOLLOWER_HEADS.get(key)
    if head is None:
        head = b"".join((_THROTTLE_ERROR_GENERATION.pack(0, error_code, generation_id),
                         _compact_strings((protocol_type, protocol_name, leader) if version >= 7
                                          else (protocol_name, leader)),
                         (b"\x01" if skip_assignment else b"\x00") if version >= 9 else b""))
        if len(_FOLLOWER_HEADS) >= _PACKED_BOUND:
            _FOLLOWER_HEADS.clear()
        _FOLLOWER_HEADS[key] = head
    return head


_PACKED: dict[tuple[str | None, ...], bytes] = {}
_PACKED_BOUND = 1_024  # distinct tuples kept packed; cleared whole when full


def _compact_strings(values: tuple[str | None, ...]) -> bytes:
    """Compact nullable strings one after another, packed once per tuple: a generation's answers share their
    protocol's names and leader (JoinGroup) or names (SyncGroup)."""
    packed = _PACKED.get(values)
    if packed is None:
        parts: list[bytes] = []
        for value in values:
            _put_string(parts, value, True)
        packed = b"".join(parts)
        if len(_PACKED) >= _PACKED_BOUND:
            _PACKED.clear()
        _PACKED[values] = packed
    return packed


def pack_sync_group_response(version: int, correlation_id: int, error_code: int, protocol_type: str | None,
                             protocol_name: str | None, assignment: bytes) -> bytes:
    """A SyncGroup response frame (throttle time 0 from v1; protocol_type and protocol_name from v5)."""
    flexible = version >= _SYNC_FLEXIBLE_FROM
    if version >= 5:  # the usual case, every member of a rebalance: the protocol's names packed once
        body = b"".join((_THROTTLE_ERROR.pack(0, error_code), _compact_strings((protocol_type, protocol_name)),
                         uvarint(len(assignment) + 1), assignment, b"\x00"))
        return _SIZE_CORRELATION.pack(len(body) + 5, correlation_id) + b"\x00" + body
    parts: list[bytes] = []
    parts.append(_THROTTLE_ERROR.pack(0, error_code) if version >= 1 else _INT16.pack(error_code))
    if version >= 5:
        _put_string(parts, protocol_type, flexible)
        _put_string(parts, protocol_name, flexible)
    _put_bytes(parts, assignment, flexible)
    if flexible:
        parts.append(b"\x00")
    return _frame(parts, correlation_id, flexible)


def pack_sync_group_request(version: int, correlation_id: int, client_id: str | None, group_id: str,
                            generation_id: int, member_id: str, group_instance_id: str | None,
                            protocol_type: str | None, protocol_name: str | None,
                            assignments: Iterable[tuple[str, bytes]]) -> bytes:
    """A complete SyncGroup request frame (for clients and load generators: the leader's carries every member's
    assignment, which kio's pure-Python writer takes milliseconds over)."""
    flexible = version >= _SYNC_FLEXIBLE_FROM
    if client_id is None:
        parts = [_HEADER.pack(_SYNC_GROUP, version, correlation_id, -1)]
    else:
        raw = client_id.encode()
        parts = [_HEADER.pack(_SYNC_GROUP, version, correlation_id, len(raw)), raw]
    if flexible:
        parts.append(b"\x00")
    _put_string(parts, group_id, flexible)
    parts.append(_INT32.pack(generation_id))
    _put_string(parts, member_id, flexible)
    if version >= 3:
        _put_string(parts, group_instance_id, flexible)
    if version >= 5:
        _put_string(parts, protocol_type, flexible)
        _put_string(parts, protocol_name, flexible)
    entries = list(assignments)
    parts.append(uvarint(len(entries) + 1) if flexible else _INT32.pack(len(entries)))
    for entry_member_id, assignment in entries:
        _put_string(parts, entry_member_id, flexible)
        _put_bytes(parts, assignment, flexible)
        if flexible:
            parts.append(b"\x00")
    if flexible:
        parts.append(b"\x00")
    body = b"".join(parts)
    return _INT32.pack(len(body)) + body


# ---------------------------------------------------------------------------------------------- kio bodies


def join_group_fields(body: object) -> JoinGroupFields:
    """The fields of a JoinGroup request the general decoder read (a kio payload of any version)."""
    rebalance_timeout = getattr(body, "rebalance_timeout", None)
    return JoinGroupFields(
        body.group_id, _ms(body.session_timeout),  # type: ignore[attr-defined]
        None if rebalance_timeout is None else _ms(rebalance_timeout),
        body.member_id, getattr(body, "group_instance_id", None), body.protocol_type,  # type: ignore[attr-defined]
        [(p.name, p.metadata) for p in body.protocols],  # type: ignore[attr-defined]
        getattr(body, "reason", None))


def sync_group_fields(body: object) -> SyncGroupFields:
    """The fields of a SyncGroup request the general decoder read (a kio payload of any version)."""
    return SyncGroupFields(
        body.group_id, body.generation_id, body.member_id,  # type: ignore[attr-defined]
        getattr(body, "group_instance_id", None), getattr(body, "protocol_type", None),
        getattr(body, "protocol_name", None),
        [(a.member_id, a.assignment) for a in body.assignments])  # type: ignore[attr-defined]


def _ms(value: datetime.timedelta) -> int:
    return value // _ONE_MS
