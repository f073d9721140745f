"""A careful reader for request bodies: forgiving about unknown tagged fields, strict about array lengths.

- Kafka's generated readers keep unknown tagged fields aside and otherwise ignore them, so a newer client may
  send tags an older broker has never heard of; kio's native reader raises KeyError instead.
- kio's native array readers reserve memory for the array length the peer claims before reading any element:
  a length prefix of a few billion aborts the whole process ("memory allocation of 112393145088 bytes
  failed", found by our fuzz test). Here every array length is checked against the bytes left in the frame
  first (every element takes at least one byte), so a lie costs nothing.
- kio's array readers return None for a null length whatever the schema says. Kafka's generated readers throw
  on a null in a non-nullable field while parsing; so do we (UnexpectedNull), so a handler only ever sees
  None where the schema allows it. (kio's string, bytes and struct readers already check this themselves.)

It walks the kio dataclass, reading scalar fields with kio's own field readers, through a reader generated once
per class (straight-line code, ~1.4x faster than a loop over the fields). The codec uses it for
every request schema that has an array (none of them is on the heartbeat path) and as the fallback when the
native reader meets an unknown tag.
"""

from __future__ import annotations

from dataclasses import Field, fields
from functools import cache
from typing import Any, Callable

from kio._kio_native import get_field_reader
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from kio.serial.errors import BufferUnderflow, UnexpectedNull
from kio.serial.readers import read_int8, read_int32, read_unsigned_varint
from kio.static.protocol import Entity

# How one field is read; a plan is the tuple of steps of an entity class, built once per class.
_SCALAR, _SCALAR_ARRAY, _NULLABLE_SCALAR_ARRAY, _ENTITY, _NULLABLE_ENTITY, _ENTITY_ARRAY, _NULLABLE_ENTITY_ARRAY = (
    range(7))
# Any in what follows: field values and entities are whatever the schema (one kio dataclass per API and version)
# says, known only at run time.
Step = tuple[str, int, Any]  # (field name, kind, native reader or nested entity class)
EntityReader = Callable[[bytes, int], tuple[Any, int]]  # (entity, bytes consumed)


def read_entity(entity_class: type[Entity], buffer: bytes, offset: int) -> tuple[Any, int]:
    """(entity, bytes consumed), like kio's entity readers."""
    return _compiled_reader(entity_class)(buffer, offset)


@cache
def _compiled_reader(entity_class: type[Entity]) -> EntityReader:
    """A reader function generated once per class from its plan: straight-line code, one statement per field,
    so a body costs little more than the native reads it is made of."""
    steps, tagged, flexible = _plan(entity_class)
    namespace: dict[str, Any] = {"CLS": entity_class, "TAGGED": tagged, "FLEX": flexible, "len": len,
                                 "read_step": _read_step, "read_tags": _read_tags,
                                 "checked_array_length": _checked_array_length}
    lines = ["def read(buffer, offset):", "    start = offset"]
    for index, (name, kind, arg) in enumerate(steps):
        namespace[f"arg{index}"] = arg
        if kind == _SCALAR:
            lines.append(f"    v{index}, size = arg{index}(buffer, offset)")
            lines.append("    offset += size")
        else:
            lines.append(f"    v{index}, offset = read_step({kind}, arg{index}, FLEX, buffer, offset)")
    arguments = ", ".join(f"{name}=v{index}" for index, (name, _kind, _arg) in enumerate(steps))
    if flexible:
        lines += [
            "    if offset < len(buffer) and buffer[offset] == 0:  # no tagged fields: the usual case",
            f"        return CLS({arguments}), offset + 1 - start",
            "    tags = {}",
            "    offset = read_tags(TAGGED, buffer, offset, tags)",
            f"    return CLS({arguments}{', ' if arguments else ''}**tags), offset - start",
        ]
    else:
        lines.append(f"    return CLS({arguments}), offset - start")
    exec("\n".join(lines), namespace)  # noqa: S102 - the code is built from kio's dataclass field names only
    read: EntityReader = namespace["read"]
    return read


@cache
def _plan(entity_class: type[Entity]) -> tuple[tuple[Step, ...], dict[int, Step], bool]:
    steps = []
    tagged = {}
    for field in fields(entity_class):
        tag = get_field_tag(field)
        step = _step(entity_class, field, is_tag=tag is not None)
        if tag is None:
            steps.append(step)
        else:
            tagged[int(tag)] = step
    return tuple(steps), tagged, bool(entity_class.__flexible__)


def _step(entity_class: type[Entity], field: Field[Any], *, is_tag: bool) -> Step:
    kind = classify_field(field)
    nullable = is_optional(field)  # for an array: `tuple[...] | None`
    if isinstance(kind, EntityTupleField):
        return field.name, _NULLABLE_ENTITY_ARRAY if nullable else _ENTITY_ARRAY, kind.type_
    if isinstance(kind, EntityField):
        return field.name, _NULLABLE_ENTITY if nullable and not is_tag else _ENTITY, kind.type_
    reader = get_field_reader(entity_class, field, False, is_tag)
    if isinstance(kind, PrimitiveTupleField):
        return field.name, _NULLABLE_SCALAR_ARRAY if nullable else _SCALAR_ARRAY, reader
    return field.name, _SCALAR, reader


def _read_step(kind: int, arg: Any, flexible: bool, buffer: bytes, offset: int) -> tuple[Any, int]:
    if kind == _SCALAR:
        value, size = arg(buffer, offset)
        return value, offset + size
    if kind == _SCALAR_ARRAY or kind == _NULLABLE_SCALAR_ARRAY:
        length, _first = _checked_array_length(flexible, buffer, offset)
        if length < 0 and kind == _SCALAR_ARRAY:
            raise UnexpectedNull("null for a non-nullable array")
        value, size = arg(buffer, offset)
        return value, offset + size
    if kind == _ENTITY_ARRAY or kind == _NULLABLE_ENTITY_ARRAY:
        return _read_entity_array(arg, kind == _NULLABLE_ENTITY_ARRAY, flexible, buffer, offset)
    if kind == _NULLABLE_ENTITY:
        marker, size = read_int8(buffer, offset)
        offset += size
        if marker < 0:
            return None, offset
    value, size = read_entity(arg, buffer, offset)
    return value, offset + size


def _read_tags(tagged: dict[int, Step], buffer: bytes, offset: int, values: dict[str, Any]) -> int:
    count, size = read_unsigned_varint(buffer, offset)
    offset += size
    for _ in range(count):
        tag, size = read_unsigned_varint(buffer, offset)
        offset += size
        length, size = read_unsigned_varint(buffer, offset)
        offset += size
        if offset + length > len(buffer):
            raise BufferUnderflow("tagged field runs past the end of the buffer")
        step = tagged.get(tag)
        if step is not None:  # unknown tags are skipped, as Kafka does
            name, kind, arg = step
            values[name], _end = _read_step(kind, arg, True, buffer, offset)
        offset += length
    return offset


def _checked_array_length(flexible: bool, buffer: bytes, offset: int) -> tuple[int, int]:
    """(element count or -1 for null, offset of the first element), refusing counts the frame cannot hold."""
    if flexible:
        encoded, size = read_unsigned_varint(buffer, offset)
        length = encoded - 1  # compact arrays store length + 1; 0 means null
    else:
        length, size = read_int32(buffer, offset)
    offset += size
    if length > len(buffer) - offset:  # every element takes at least one byte
        raise BufferUnderflow(f"array of {length} elements in {len(buffer) - offset} bytes")
    return length, offset


def _read_entity_array(item_class: type[Entity], nullable: bool, flexible: bool, buffer: bytes,
                       offset: int) -> tuple[Any, int]:
    length, offset = _checked_array_length(flexible, buffer, offset)
    if length < 0:
        if not nullable:
            raise UnexpectedNull("null for a non-nullable array")
        return None, offset
    read_item = _compiled_reader(item_class)
    items = []
    for _ in range(length):
        item, size = read_item(buffer, offset)
        items.append(item)
        offset += size
    return tuple(items), offset


@cache
def has_arrays(entity_class: type[Entity]) -> bool:
    """Whether any field of the entity, at any depth, is an array (so the native reader is unsafe on it)."""
    for field in fields(entity_class):
        kind = classify_field(field)
        if kind.is_array or (isinstance(kind, EntityField) and has_arrays(kind.type_)):
            return True
    return False
