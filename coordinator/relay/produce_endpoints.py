"""Produce v10+ answers through the relay: KIP-951's NodeEndpoints point at our listeners, not at the brokers.

A broker fills the response's NodeEndpoints (a top-level tagged field) only for partitions answered
NOT_LEADER_OR_FOLLOWER with their new leader, so nearly every answer has none and is relayed byte for byte: a
walk over the frame (no decoding, every length bounded by the bytes present) finds the top-level tagged fields,
and only a frame that has some is decoded, rewritten (each node's host:port becomes the listener we keep for it;
a node we have no listener for is left out, so the client asks Metadata) and encoded again. Clients need
Produce v12 for transaction version 2 (KIP-890 part 2: the partition leader adds the partition to the
transaction), which is why the relay cannot stop at v9.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable

from kio.serial.errors import SerialError

from coordinator.relay.versions import uvarint
from protocol import apis
from protocol.codec import encode_response_frame
from protocol.errors import ProtocolError
from protocol.tolerant import read_entity

_PRODUCE = 0
FIRST_WITH_ENDPOINTS = 10  # Produce v10 (KIP-951)
_TOPIC_ID_VERSION = 13  # topics named by id from v13 on
_CORRELATION_AND_SIZE = 8

AddressOf = Callable[[int], "tuple[str, int] | None"]


def endpoints_rewriter(version: int, address_of: AddressOf) -> Callable[[memoryview], bytes | None] | None:
    """What the relay applies to a Produce response of `version` (None: nothing to look at, relayed as is)."""
    if version < FIRST_WITH_ENDPOINTS:
        return None
    return lambda frame: rewrite_endpoints(frame, version, address_of)


def rewrite_endpoints(frame: memoryview, version: int, address_of: AddressOf) -> bytes | None:
    """The frame (size prefix included) with its NodeEndpoints rewritten, or None when it has none.

    Raises ValueError for a frame that does not parse."""
    body_at, tags_at = _body_and_tags(frame, version)
    if frame[tags_at] == 0:  # no top-level tagged field
        return None
    raw = bytes(frame)
    try:
        body, _end = read_entity(apis.response_class(_PRODUCE, version), raw, body_at)
    except (SerialError, ProtocolError, ValueError, IndexError, OverflowError, struct.error) as exc:
        raise ValueError(f"produce response: {exc!r}") from None
    endpoints = []
    for node in body.node_endpoints:
        address = address_of(int(node.node_id))
        if address is not None:
            endpoints.append(dataclasses.replace(node, host=address[0], port=address[1]))
    correlation_id = int.from_bytes(raw[4:8], "big", signed=True)
    rewritten = dataclasses.replace(body, node_endpoints=tuple(endpoints))
    return encode_response_frame(correlation_id, 1, rewritten)


def _body_and_tags(frame: memoryview, version: int) -> tuple[int, int]:
    """Where the body starts and where its top-level tagged fields start (one pass on the relay's hot path:
    locals only, one-byte varints read inline)."""
    end = len(frame)
    position = _skip_tags(frame, _CORRELATION_AND_SIZE, end)  # the response header's
    body_at = position
    topics, position = _compact_length(frame, position, end)
    for _topic in range(topics):
        if version >= _TOPIC_ID_VERSION:
            position += 16
        else:
            length, position = _compact_length(frame, position, end)
            position += length
        partitions, position = _compact_length(frame, position, end)
        for _partition in range(partitions):
            position += 30  # index, error code, base offset, log append time, log start offset
            record_errors, position = _compact_length(frame, position, end)
            for _record_error in range(record_errors):
                length, position = _compact_length(frame, position + 4, end)  # batch index, nullable message
                position = _skip_tags(frame, position + length, end)
            length, position = _compact_length(frame, position, end)  # nullable error message
            position = _skip_tags(frame, position + length, end)  # CurrentLeader
        position = _skip_tags(frame, position, end)
    tags_at = position + 4  # throttle time
    position = _skip_tags(frame, tags_at, end)
    if position != end:
        raise ValueError(f"produce response: {end - position} bytes after the body")
    return body_at, tags_at


def _compact_length(frame: memoryview, position: int, end: int) -> tuple[int, int]:
    """A compact array's or string's length (0 for null), bounded by the bytes left."""
    if position >= end:
        raise ValueError("produce response: truncated")
    byte = frame[position]
    if byte & 0x80:
        value, position = uvarint(frame, position)
    else:
        value, position = byte, position + 1
    length = value - 1 if value else 0
    if length > end - position:
        raise ValueError("produce response: length past the frame")
    return length, position


def _skip_tags(frame: memoryview, position: int, end: int) -> int:
    if position >= end:
        raise ValueError("produce response: truncated")
    if frame[position] == 0:
        return position + 1
    count, position = uvarint(frame, position)
    for _ in range(count):
        _tag, position = uvarint(frame, position)
        size, position = uvarint(frame, position)
        position += size
        if position > end:
            raise ValueError("produce response: truncated")
    return position
