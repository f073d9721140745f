"""coordinator/group/api.py: the per-member classes of a rebalance have their `__init__` written out (mypyc leaves a
dataclass's generated one interpreted). Each must still take every field, by keyword, and give each field the
dataclass's default when left out: a field added to the class and not to its `__init__` fails here."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from coordinator.group import api
from protocol.error_codes import Errors

WRITTEN_OUT = [api.JoinGroupRequest, api.JoinGroupResponseMember, api.JoinGroupResponse,
               api.SyncGroupRequestAssignment, api.SyncGroupRequest, api.SyncGroupResponse]


def _required(field: dataclasses.Field[Any]) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _a_value(field: dataclasses.Field[Any], index: int) -> Any:
    """A value of the field's kind, different from its default (and from the other fields')."""
    if field.name == "error_code":
        return Errors.REBALANCE_IN_PROGRESS
    kind = str(field.type)
    if "bool" in kind:
        return True
    if "int" in kind:
        return 1000 + index
    if "bytes" in kind:
        return f"b{index}".encode()
    if "list" in kind:
        return [object()]
    return f"s{index}"


def test_every_class_with_a_written_out_init_is_listed() -> None:
    marked = [cls for cls in vars(api).values() if dataclasses.is_dataclass(cls) and isinstance(cls, type)
              and "__init__" in cls.__dict__ and not cls.__dataclass_params__.init]  # type: ignore[attr-defined]
    assert sorted(cls.__name__ for cls in marked) == sorted(cls.__name__ for cls in WRITTEN_OUT)


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda cls: cls.__name__)
def test_every_field_is_taken_by_keyword(cls: type) -> None:
    values = {field.name: _a_value(field, i) for i, field in enumerate(dataclasses.fields(cls))}
    made = cls(**values)
    assert {name: getattr(made, name) for name in values} == values


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda cls: cls.__name__)
def test_a_field_left_out_gets_the_dataclass_default(cls: type) -> None:
    fields = dataclasses.fields(cls)
    made = cls(**{field.name: _a_value(field, i) for i, field in enumerate(fields) if _required(field)})
    for field in fields:
        if field.default is not dataclasses.MISSING:
            assert getattr(made, field.name) == field.default, field.name
        elif field.default_factory is not dataclasses.MISSING:
            assert getattr(made, field.name) == field.default_factory(), field.name
