"""A slow, forgiving reader for request bodies that carry tagged fields kio does not know.

Kafka's generated readers keep unknown tagged fields aside and otherwise ignore them, so a newer client may
send tags an older broker has never heard of. kio's native reader raises KeyError instead. This walks the kio
dataclass by hand, reading every known field with kio's own field readers and skipping unknown tags, at every
nesting level. It runs only after the native reader refused a message.
"""

from __future__ import annotations

from dataclasses import Field, fields
from functools import cache
from typing import Any

from kio._kio_native import get_field_reader
from kio.serial._introspect import EntityField, EntityTupleField, classify_field, get_field_tag, is_optional
from kio.serial.errors import BufferUnderflow
from kio.serial.readers import read_int8, read_int32, read_unsigned_varint


def read_skipping_unknown_tags(entity_class: type, buffer: bytes, offset: int) -> tuple[Any, int]:
    """(entity, bytes consumed), like kio's entity readers."""
    start = offset
    values: dict[str, Any] = {}
    regular, tagged = _split_fields(entity_class)
    for field in regular:
        values[field.name], offset = _read_field(entity_class, field, buffer, offset, is_tag=False)
    if entity_class.__flexible__:
        offset = _read_tags(entity_class, tagged, buffer, offset, values)
    return entity_class(**values), offset - start


@cache
def _split_fields(entity_class: type) -> tuple[tuple[Field, ...], dict[int, Field]]:
    regular = tuple(f for f in fields(entity_class) if get_field_tag(f) is None)
    tagged = {int(tag): f for f in fields(entity_class) if (tag := get_field_tag(f)) is not None}
    return regular, tagged


def _read_tags(entity_class: type, tagged: dict[int, Field], buffer: bytes, offset: int, values: dict) -> int:
    count, size = read_unsigned_varint(buffer, offset)
    offset += size
    for _ in range(count):
        tag, size = read_unsigned_varint(buffer, offset)
        offset += size
        length, size = read_unsigned_varint(buffer, offset)
        offset += size
        if offset + length > len(buffer):
            raise BufferUnderflow("tagged field runs past the end of the buffer")
        field = tagged.get(tag)
        if field is not None:
            values[field.name], _end = _read_field(entity_class, field, buffer, offset, is_tag=True)
        offset += length
    return offset


def _read_field(entity_class: type, field: Field, buffer: bytes, offset: int, *, is_tag: bool) -> tuple[Any, int]:
    kind = classify_field(field)
    if isinstance(kind, EntityTupleField):
        return _read_entity_array(entity_class, kind.type_, buffer, offset)
    if isinstance(kind, EntityField):
        if is_optional(field) and not is_tag:
            marker, size = read_int8(buffer, offset)
            offset += size
            if marker < 0:
                return None, offset
        value, size = read_skipping_unknown_tags(kind.type_, buffer, offset)
        return value, offset + size
    value, size = get_field_reader(entity_class, field, False, is_tag)(buffer, offset)
    return value, offset + size


def _read_entity_array(entity_class: type, item_class: type, buffer: bytes, offset: int) -> tuple[Any, int]:
    if entity_class.__flexible__:
        encoded, size = read_unsigned_varint(buffer, offset)
        length = encoded - 1  # compact arrays store length + 1; 0 means null
    else:
        length, size = read_int32(buffer, offset)
    offset += size
    if length < 0:
        return None, offset
    items = []
    for _ in range(length):
        item, size = read_skipping_unknown_tags(item_class, buffer, offset)
        items.append(item)
        offset += size
    return tuple(items), offset
