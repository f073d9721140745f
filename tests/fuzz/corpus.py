"""A corpus of valid request frames, each with a map of where its length prefixes, varints and booleans sit.

`request_frame(api_key, version)` builds one valid request of any kio request schema: every field gets a plain
value (strings "fz-<field>", ints 1, arrays of two elements, nullable structs present, tagged fields at their
defaults) and is encoded by a schema walk that records a `Site` for every place a mutation can lie about:
array, string and bytes lengths, varints (compact lengths, tag counts), booleans, nullable-struct markers and
the request header's own fields. The walk's bytes are checked against kio's writer (tests/unit), so the sites
point at the bytes a real client sends.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import uuid
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from kio.index import load_request_schema
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from protocol.fastpath import unsigned_varint

# What a site holds, so a mutation knows how to rewrite it.
ARRAY, STRING, BYTES, TAG_COUNT, BOOL, MARKER, INT = "array", "string", "bytes", "tag_count", "bool", "marker", "int"
LENGTH_KINDS = (ARRAY, STRING, BYTES)
CONTROL_GROUP = "fuzz-control"  # never used by the corpus, so mutations cannot touch the control group
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_FIXED = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q", "uint8": ">B", "uint16": ">H",
          "uint32": ">I", "uint64": ">Q", "float64": ">d", "error_code": ">h"}


@dataclass(frozen=True, slots=True)
class Site:
    kind: str  # ARRAY, STRING, BYTES, TAG_COUNT, BOOL, MARKER or INT (a signed int8..int64 value: a duration,
    # a generation, a partition, a timeout ...)
    offset: int  # in the frame payload (after the size prefix)
    width: int  # bytes the encoded length/varint/flag takes
    compact: bool  # a varint (compact) length rather than an int16/int32 one
    nullable: bool  # the schema allows null here
    end: int  # offset after what the site governs (an array's elements, a string's bytes); else offset + width


@dataclass(frozen=True, slots=True)
class CorpusFrame:
    api_key: int
    version: int
    payload: bytes  # the request without its size prefix
    sites: tuple[Site, ...]

    @property
    def frame(self) -> bytes:
        return struct.pack(">i", len(self.payload)) + self.payload


ApiRange = tuple[int, int, int]  # (api_key, lowest version, highest version)


def build_corpus(ranges: Iterable[ApiRange], correlation_id: int = 1) -> list[CorpusFrame]:
    """One valid request per API at its lowest and at its highest version."""
    corpus = []
    for api_key, low, high in ranges:
        for version in sorted({low, high}):
            corpus.append(request_frame(api_key, version, correlation_id))
    return corpus


def request_frame(api_key: int, version: int, correlation_id: int = 1, client_id: str = "fuzz") -> CorpusFrame:
    body_class = load_request_schema(api_key, version)
    walk = _Walk()
    walk.fixed(">hhi", api_key, version, correlation_id)
    walk.string(client_id, compact=False, nullable=True)  # the header's client_id is never compact
    if body_class.__flexible__:
        walk.tags()
    walk.entity(sample(body_class))
    return CorpusFrame(api_key, version, bytes(walk.out), tuple(walk.sites))


# ---------------------------------------------------------------------------------------------- values


def sample(entity_class: type) -> Any:
    """A valid instance of a kio entity class with a plain value in every field."""
    values = {}
    for field in fields(entity_class):
        if get_field_tag(field) is not None:
            continue  # tagged fields keep their defaults, so none is written
        kind = classify_field(field)
        if isinstance(kind, EntityTupleField):
            values[field.name] = (sample(kind.type_), sample(kind.type_))
        elif isinstance(kind, EntityField):
            values[field.name] = sample(kind.type_)
        elif isinstance(kind, PrimitiveTupleField):
            values[field.name] = tuple(_primitive(get_schema_field_type(field), field.name, i) for i in (0, 1))
        else:
            values[field.name] = _primitive(get_schema_field_type(field), field.name, 0)
    return entity_class(**values)


def _primitive(kafka_type: str, name: str, index: int) -> Any:
    if kafka_type == "string":
        return "fz-" + name.replace("_", "-")[:12] + (f"-{index}" if index else "")
    if kafka_type in ("bytes", "records"):
        return b"\x00\x01fz"
    if kafka_type == "bool":
        return True
    if kafka_type == "uuid":
        return uuid.UUID(int=0x0F0F + index)
    if kafka_type == "float64":
        return 1.0
    if kafka_type.startswith("timedelta"):
        return datetime.timedelta(milliseconds=1_000)
    if kafka_type == "datetime_i64":
        return _EPOCH + datetime.timedelta(milliseconds=1_000)
    if kafka_type == "error_code":
        from kio.schema.errors import ErrorCode

        return ErrorCode.none
    return index + 1


# ---------------------------------------------------------------------------------------------- encoding


class _Walk:
    def __init__(self) -> None:
        self.out = bytearray()
        self.sites: list[Site] = []

    def fixed(self, fmt: str, *values: Any) -> None:
        self.out += struct.pack(fmt, *values)

    def length(self, kind: str, value: int, *, compact: bool, nullable: bool, legacy_fmt: str) -> int:
        """Write a length prefix; returns the index of its site, whose `end` the caller sets after the content."""
        start = len(self.out)
        if compact:
            self.out += unsigned_varint(value + 1)  # compact lengths are stored plus one; 0 is null
        else:
            self.fixed(legacy_fmt, value)
        self.sites.append(Site(kind, start, len(self.out) - start, compact, nullable, len(self.out)))
        return len(self.sites) - 1

    def ends_here(self, index: int) -> None:
        self.sites[index] = dataclasses.replace(self.sites[index], end=len(self.out))

    def string(self, value: str | None, *, compact: bool, nullable: bool) -> None:
        raw = None if value is None else value.encode()
        site = self.length(STRING, -1 if raw is None else len(raw), compact=compact, nullable=nullable,
                           legacy_fmt=">h")
        self.out += raw or b""
        self.ends_here(site)

    def bytes_(self, value: bytes | None, *, compact: bool, nullable: bool) -> None:
        site = self.length(BYTES, -1 if value is None else len(value), compact=compact, nullable=nullable,
                           legacy_fmt=">i")
        self.out += value or b""
        self.ends_here(site)

    def flag(self, kind: str, value: int, nullable: bool = False) -> None:
        self.sites.append(Site(kind, len(self.out), 1, False, nullable, len(self.out) + 1))
        self.fixed(">b", value)

    def tags(self) -> None:
        self.sites.append(Site(TAG_COUNT, len(self.out), 1, True, False, len(self.out) + 1))
        self.out.append(0)

    def entity(self, entity: Any) -> None:
        flexible = bool(entity.__flexible__)
        for field in fields(entity):
            tag = get_field_tag(field)
            if tag is None:
                self.field(field, getattr(entity, field.name), flexible)
            elif getattr(entity, field.name) != field.default and field.default is not MISSING:
                raise ValueError(f"{type(entity).__name__}.{field.name}: the corpus writes no tagged fields")
        if flexible:
            self.tags()

    def field(self, field: Any, value: Any, flexible: bool) -> None:
        kind = classify_field(field)
        nullable = is_optional(field)
        if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            site = self.length(ARRAY, -1 if value is None else len(value), compact=flexible, nullable=nullable,
                               legacy_fmt=">i")
            for item in value or ():
                if isinstance(kind, EntityTupleField):
                    self.entity(item)
                else:
                    self.primitive(get_schema_field_type(field), item, flexible, nullable=False)
            self.ends_here(site)
        elif isinstance(kind, EntityField):
            if nullable:
                self.flag(MARKER, -1 if value is None else 1, nullable=True)
            if value is not None:
                self.entity(value)
        else:
            self.primitive(get_schema_field_type(field), value, flexible, nullable)

    def primitive(self, kafka_type: str, value: Any, flexible: bool, nullable: bool) -> None:
        if kafka_type == "string":
            self.string(value, compact=flexible, nullable=nullable)
        elif kafka_type in ("bytes", "records"):
            self.bytes_(value, compact=flexible, nullable=nullable)
        elif kafka_type == "bool":
            self.flag(BOOL, 1 if value else 0)
        elif kafka_type == "uuid":
            self.out += (value or uuid.UUID(int=0)).bytes
        elif kafka_type.startswith("timedelta"):
            width = 4 if kafka_type.endswith("i32") else 8
            self.sites.append(Site(INT, len(self.out), width, False, False, len(self.out) + width))
            self.fixed(">i" if width == 4 else ">q", value // datetime.timedelta(milliseconds=1))
        elif kafka_type == "datetime_i64":
            self.fixed(">q", -1 if value is None else (value - _EPOCH) // datetime.timedelta(milliseconds=1))
        elif kafka_type in ("int8", "int16", "int32", "int64"):
            self.sites.append(Site(INT, len(self.out), int(kafka_type[3:]) // 8, False, False,
                                   len(self.out) + int(kafka_type[3:]) // 8))
            self.fixed(_FIXED[kafka_type], value)
        else:
            self.fixed(_FIXED[kafka_type], value)
