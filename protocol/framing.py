"""Sans-IO framing of the Kafka protocol: every message is an int32 big-endian size followed by that many bytes.

`FrameReader` lends its own buffer to the transport (the `asyncio.BufferedProtocol` shape: `get_buffer()` then
`buffer_updated(n)`), or takes bytes with `feed()`, and hands out complete frames. A size prefix is checked
before anything is allocated for it, so a 2 GiB or negative prefix costs nothing. Nor does a size that lies
within the limit: room for a big frame grows with the bytes that actually arrive (at most doubling what is
buffered), not with what the prefix claims. (Before, 8 bytes claiming 100 MB allocated 100 MB at once, per
connection, found by the mutation fuzzer: docs/protocol.md.)
"""

from __future__ import annotations

import struct

from protocol.errors import InvalidFrameSize

_SIZE = struct.Struct(">i")
SIZE_PREFIX_BYTES = 4
DEFAULT_MAX_FRAME_BYTES = 104_857_600  # Kafka's socket.request.max.bytes
_MIN_FREE_BYTES = 4_096
_INITIAL_CAPACITY = 8_192  # per connection: 10k connections hold 80 MiB, not 640
_SHRINK_ABOVE_BYTES = 65_536
_GROWTH_FLOOR_BYTES = 65_536  # a frame up to this size gets all its room at once


class FrameReader:
    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray(_INITIAL_CAPACITY)
        self._view = memoryview(self._buf)  # never resized in place (a view is exported): replaced instead
        self._start = 0  # first unconsumed byte
        self._end = 0  # one past the last received byte

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet handed out as frames."""
        return self._end - self._start

    def get_buffer(self) -> memoryview:
        """Free space to receive into; the caller must report how much it wrote with `buffer_updated`."""
        if not self._end:  # empty (the usual read: a peer's next request): the whole buffer, no new view
            return self._view
        if self._end - self._start >= SIZE_PREFIX_BYTES or len(self._buf) - self._end < _MIN_FREE_BYTES:
            self._make_room(self._wanted_bytes())
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes

    def only_frame(self) -> bytes | None:
        """The buffered bytes as a frame's payload when they are exactly one whole frame (a client's next request,
        the usual read), the buffer then empty; otherwise None and nothing taken (`next_frame` hands out what is
        there and reports a bad size prefix). For a connection that answers such a frame straight away."""
        start = self._start
        available = self._end - start
        if available > SIZE_PREFIX_BYTES:
            size: int
            (size,) = _SIZE.unpack_from(self._buf, start)
            if size == available - SIZE_PREFIX_BYTES and size <= self.max_frame_bytes:
                frame = bytes(self._view[start + SIZE_PREFIX_BYTES:self._end])
                self._emptied()
                return frame
        return None

    def feed(self, data: bytes) -> None:
        """Copy `data` in (for callers that receive bytes rather than lend a buffer)."""
        self._make_room(max(len(data), self._wanted_bytes()))
        self._buf[self._end : self._end + len(data)] = data
        self._end += len(data)

    def next_frame(self) -> bytes | None:
        """The next complete frame's payload (without its size prefix), or None until more bytes arrive.

        Raises InvalidFrameSize as soon as a bad size prefix is visible.
        """
        available = self._end - self._start
        if available < SIZE_PREFIX_BYTES:
            return None
        size = self._checked_size()
        if available - SIZE_PREFIX_BYTES < size:
            return None
        begin = self._start + SIZE_PREFIX_BYTES
        self._start = begin + size
        frame = self._view[begin : self._start].tobytes()
        if self._start == self._end:
            self._emptied()
        return frame

    def _emptied(self) -> None:
        self._start = self._end = 0
        if len(self._buf) > _SHRINK_ABOVE_BYTES:  # give back the room a big frame needed
            self._replace(bytearray(_INITIAL_CAPACITY))

    def _checked_size(self) -> int:
        size: int
        (size,) = _SIZE.unpack_from(self._buf, self._start)
        if size < 0 or size > self.max_frame_bytes:
            raise InvalidFrameSize(f"frame size {size} outside [0, {self.max_frame_bytes}]")
        return size

    def _wanted_bytes(self) -> int:
        """Free bytes worth offering: the rest of a partly received frame, but no more than as much again as
        has arrived of it (the prefix may lie), else a comfortable minimum."""
        available = self._end - self._start
        if available >= SIZE_PREFIX_BYTES:
            size: int
            (size,) = _SIZE.unpack_from(self._buf, self._start)
            if 0 <= size <= self.max_frame_bytes:  # a bad size is reported by next_frame, not here
                missing = SIZE_PREFIX_BYTES + size - available
                return max(min(missing, max(available, _GROWTH_FLOOR_BYTES)), _MIN_FREE_BYTES)
        return _MIN_FREE_BYTES

    def _make_room(self, wanted: int) -> None:
        if len(self._buf) - self._end >= wanted:
            return
        pending = self._end - self._start
        capacity = max(len(self._buf), pending + wanted)
        # A fresh buffer rather than an in-place resize: the transport may still hold a view of the old one.
        fresh = bytearray(capacity)
        fresh[:pending] = self._view[self._start : self._end]
        self._replace(fresh)
        self._start, self._end = 0, pending

    def _replace(self, buffer: bytearray) -> None:
        # no release() of the old view: the transport may still hold a slice of it during buffer_updated
        self._buf, self._view = buffer, memoryview(buffer)


def encode_frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload
