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
from collections.abc import Callable

from protocol import apis
from protocol.codec import encode_response_frame
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
    body, _end = read_entity(apis.response_class(_PRODUCE, version), raw, body_at)
    endpoints = []
    for node in body.node_endpoints:
        address = address_of(int(node.node_id))
        if address is not None:
            endpoints.append(dataclasses.replace(node, host=address[0], port=address[1]))
    correlation_id = int.from_bytes(raw[4:8], "big", signed=True)
    rewritten = dataclasses.replace(body, node_endpoints=tuple(endpoints))
    return encode_response_frame(correlation_id, 1, rewritten)


def _body_and_tags(frame: memoryview, version: int) -> tuple[int, int]:
    """Where the body starts and where its top-level tagged fields start."""
    walk = _Walk(frame, _CORRELATION_AND_SIZE)
    walk.tags()  # the response header's
    body_at = walk.position
    for _topic in range(walk.compact_length()):
        if version >= _TOPIC_ID_VERSION:
            walk.skip(16)
        else:
            walk.skip(walk.compact_length())
        for _partition in range(walk.compact_length()):
            walk.skip(4 + 2 + 8 + 8 + 8)  # index, error code, base offset, log append time, log start offset
            for _record_error in range(walk.compact_length()):
                walk.skip(4)
                walk.skip(walk.compact_length())  # nullable message
                walk.tags()
            walk.skip(walk.compact_length())  # nullable error message
            walk.tags()  # CurrentLeader
        walk.tags()
    walk.skip(4)  # throttle time
    tags_at = walk.position
    walk.tags()
    if walk.position != len(frame):
        raise ValueError(f"produce response: {len(frame) - walk.position} bytes after the body")
    return body_at, tags_at


class _Walk:
    __slots__ = ("frame", "position")

    def __init__(self, frame: memoryview, position: int) -> None:
        self.frame = frame
        self.position = position

    def skip(self, count: int) -> None:
        if count < 0 or self.position + count > len(self.frame):
            raise ValueError("produce response: truncated")
        self.position += count

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            if self.position >= len(self.frame) or shift > 28:
                raise ValueError("produce response: bad varint")
            byte = self.frame[self.position]
            self.position += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def compact_length(self) -> int:
        """A compact array's or string's length (0 for null); bounded by the bytes left."""
        length = max(self.uvarint() - 1, 0)
        if length > len(self.frame) - self.position:
            raise ValueError("produce response: length past the frame")
        return length

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.skip(self.uvarint())
