"""The steady ConsumerGroupHeartbeat read and answered by hand: the request a member sends between changes (group
id, member id and epoch; every other field null, i.e. unchanged) and its answer (no error, the member's id, epoch
and heartbeat interval, no assignment). Every other shape goes to protocol.fastpath's reader or the general codec.

API 68 v0–v1 (flexible): request header v2, response header v1; the two versions' responses are the same.
Tests compare both with kio, the general codec (tests/unit/test_consumer_group_heartbeat_codec.py).
"""

from __future__ import annotations

import struct

from protocol.group_fastpath import _header, _NotUsual, _string, uvarint

_API_KEY = 68
_INT32 = struct.Struct(">i")
# After the member epoch, per version: instance id, rack id, rebalance timeout -1, topic names, (v1: regex,)
# assignor, owned partitions, all null; then no tagged fields. Bytes after it are ignored, as kio ignores them.
_STEADY_TAILS = (b"\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00\x00")
# size, correlation id, header tags, throttle time 0, error code 0, error message null
_ANSWER_HEAD = struct.Struct(">iiBihB")
# member epoch, heartbeat interval, assignment null (-1), body tags
_ANSWER_TAIL = struct.Struct(">iibB")
_ANSWER_FIXED = _ANSWER_HEAD.size - 4 + _ANSWER_TAIL.size
_SHORT_LENGTHS = tuple(bytes((n,)) for n in range(0x80))  # a compact length of one byte


def read_steady_heartbeat(frame: bytes) -> tuple[int, int, str | None, str, str, int] | None:
    """(api_version, correlation_id, client_id, group_id, member_id, member_epoch) of a ConsumerGroupHeartbeat v0/v1
    request (frame without its size prefix) whose every field after the epoch is null and which has no tagged
    fields; None for anything else. Lengths are checked against the frame (protocol.group_fastpath's readers)."""
    try:
        version, correlation_id, client_id, _, offset = _header(frame, _API_KEY, 0)
        if version > 1:
            return None
        group_id, offset = _string(frame, offset, True)
        member_id, offset = _string(frame, offset, True)
        (member_epoch,) = _INT32.unpack_from(frame, offset)
        offset += 4
        tail = _STEADY_TAILS[version]
        if frame[offset:offset + len(tail)] != tail:
            return None
    except (IndexError, struct.error, UnicodeDecodeError, _NotUsual):
        return None
    return version, correlation_id, client_id, group_id, member_id, member_epoch


def pack_steady_answer(correlation_id: int, member_id: str, member_epoch: int, heartbeat_interval_ms: int) -> bytes:
    """The complete response frame: no error, no message, the member's id, epoch and interval, no assignment."""
    raw = member_id.encode()
    length = _SHORT_LENGTHS[len(raw) + 1] if len(raw) < 0x7F else uvarint(len(raw) + 1)
    return b"".join((_ANSWER_HEAD.pack(_ANSWER_FIXED + len(length) + len(raw), correlation_id, 0, 0, 0, 0),
                     length, raw, _ANSWER_TAIL.pack(member_epoch, heartbeat_interval_ms, -1, 0)))
