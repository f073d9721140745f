"""A test's front to a real GroupRuntime, handed to the server as its GroupService (coordinator/server/context.py).

The server reaches the group layer only through that protocol, so a test that needs to steer or watch an entry
point puts a `ServiceFront` there instead of subclassing GroupRuntime or replacing a method on the runtime's
instance, neither of which a compiled runtime allows (`interpreted classes cannot inherit from compiled`,
`attribute ... is read-only`). A subclass overrides the entry points it wants and reaches the real ones through
`self.runtime`; an attribute set on the front (`front.start_join_group = None`) is what the server sees; every
other attribute is the runtime's.
"""
from __future__ import annotations

from typing import Any

from coordinator.group.runtime import GroupRuntime


class ServiceFront:
    def __init__(self, runtime: GroupRuntime) -> None:
        self.runtime = runtime

    def __getattr__(self, name: str) -> Any:  # only for what the front itself does not have
        return getattr(self.runtime, name)
