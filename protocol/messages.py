"""Helpers for building kio messages of any version from one set of values, so a handler writes one mapping
for all versions of an API instead of one per version.

`build(cls, **values)` keeps only the fields `cls` has at its version (e.g. `throttle_time` appears in v1+);
`item_class(cls, "members")` is the nested entity class of a field at that same version; durations cross the
edge as int milliseconds (`ms`) and error codes as ints (`error`).
"""

from __future__ import annotations

import datetime
import typing
from dataclasses import fields, is_dataclass
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

ZERO_DURATION = datetime.timedelta(0)


@cache
def field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def build(cls: type, **values: Any) -> Any:  # Any: field values and the entity of any (API, version)
    names = field_names(cls)
    return cls(**{name: value for name, value in values.items() if name in names})


@cache
def item_class(cls: type, field_name: str) -> type:
    """The entity class inside field `field_name` of `cls` (an entity, an array of entities, or optional)."""
    for f in fields(cls):
        if f.name == field_name:
            entity = _entity_in(f.type)
            if entity is None:
                raise TypeError(f"{cls.__name__}.{field_name} holds no entity")
            return entity
    raise AttributeError(f"{cls.__name__} has no field {field_name}")


def _entity_in(annotation: Any) -> type | None:  # Any: a field's annotation, a class or a generic alias
    if isinstance(annotation, type) and is_dataclass(annotation):
        return annotation
    for argument in typing.get_args(annotation):  # tuple[X, ...], X | None, tuple[X, ...] | None
        entity = _entity_in(argument)
        if entity is not None:
            return entity
    return None


def ms(value: datetime.timedelta | None) -> int:
    return 0 if value is None else int(value // datetime.timedelta(milliseconds=1))


def error(code: int) -> ErrorCode:
    return ErrorCode(int(code))
