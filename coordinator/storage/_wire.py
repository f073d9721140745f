"""Kafka's message-schema primitives for record keys and values (big-endian), classic and flexible.

Classic versions: string = int16 length + UTF-8 (-1 = null), bytes = int32 length, array = int32 count.
Flexible versions: compact lengths as unsigned varints of length + 1 (0 = null) and a tagged-field section
at the end of every struct. Only what `__consumer_offsets` records need is here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_INT16_MAX = 0x7FFF


class RecordFormatError(ValueError):
    """Bytes that are not a valid record of the claimed schema version, or a value that cannot be encoded."""


class Writer:
    def __init__(self, flexible: bool = False) -> None:
        self.flexible = flexible
        self._out = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self._out)

    def int16(self, value: int) -> None:
        self._out += _I16.pack(value)

    def int32(self, value: int) -> None:
        self._out += _I32.pack(value)

    def int64(self, value: int) -> None:
        self._out += _I64.pack(value)

    def uvarint(self, value: int) -> None:
        while value > 0x7F:
            self._out.append((value & 0x7F) | 0x80)
            value >>= 7
        self._out.append(value)

    def string(self, value: str | None, nullable: bool = False) -> None:
        if value is None:
            if not nullable:
                raise RecordFormatError("null given for a non-nullable string")
            self._length(-1, compact=self.flexible, classic=self.int16)
            return
        data = value.encode("utf-8")
        if len(data) > _INT16_MAX:
            raise RecordFormatError(f"string of {len(data)} bytes exceeds the schema's int16 length")
        self._length(len(data), compact=self.flexible, classic=self.int16)
        self._out += data

    def bytes_(self, value: bytes) -> None:
        self._length(len(value), compact=self.flexible)
        self._out += value

    def array_length(self, count: int) -> None:
        self._length(count, compact=self.flexible)

    def tagged_fields(self) -> None:
        """An empty tagged-field section (flexible versions only): we define no tagged fields."""
        if self.flexible:
            self.uvarint(0)

    def _length(self, length: int, compact: bool, classic: Callable[[int], None] | None = None) -> None:
        if compact:
            self.uvarint(length + 1)
        else:
            (classic or self.int32)(length)


class Reader:
    __slots__ = ("_data", "pos", "flexible")

    def __init__(self, data: bytes, pos: int = 0, flexible: bool = False) -> None:
        self._data = data
        self.pos = pos
        self.flexible = flexible

    def _unpack(self, fmt: struct.Struct) -> int:
        try:
            (value,) = fmt.unpack_from(self._data, self.pos)
        except struct.error as exc:
            raise RecordFormatError(f"truncated record at byte {self.pos}") from exc
        self.pos += fmt.size
        return int(value)

    def int16(self) -> int:
        return self._unpack(_I16)

    def int32(self) -> int:
        return self._unpack(_I32)

    def int64(self) -> int:
        return self._unpack(_I64)

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            if self.pos >= len(self._data):
                raise RecordFormatError(f"truncated varint at byte {self.pos}")
            byte = self._data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise RecordFormatError("varint longer than 5 bytes")

    def _length(self, classic: Callable[[], int]) -> int:
        return self.uvarint() - 1 if self.flexible else classic()

    def _take(self, length: int) -> bytes:
        end = self.pos + length
        if end > len(self._data):
            raise RecordFormatError(f"field of {length} bytes runs past the end at byte {self.pos}")
        chunk = self._data[self.pos:end]
        self.pos = end
        return bytes(chunk)

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise RecordFormatError(f"null in a non-nullable string at byte {self.pos}")
        return value

    def nullable_string(self) -> str | None:
        length = self._length(self.int16)
        if length < 0:
            return None
        try:
            return self._take(length).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"invalid UTF-8 in a string ending at byte {self.pos}") from exc

    def bytes_(self) -> bytes:
        length = self._length(self.int32)
        if length < 0:
            raise RecordFormatError(f"null in a non-nullable bytes field at byte {self.pos}")
        return self._take(length)

    def array_length(self) -> int:
        count = self._length(self.int32)
        if count < 0:
            raise RecordFormatError(f"null array at byte {self.pos}")
        return count

    def skip_tagged_fields(self) -> None:
        """Flexible versions: skip every tagged field (we know none, so all are ignorable by definition)."""
        if not self.flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())

    def expect_end(self) -> None:
        if self.pos != len(self._data):
            raise RecordFormatError(f"{len(self._data) - self.pos} unexpected trailing bytes")
