"""One module per Kafka API; each declares its API_KEY and a `handle(ctx, header, body)` that returns the kio
response payload, or a coroutine producing it ("no response now: the group answers later"). The served version
ranges live in protocol.apis.SERVED_APIS; a test checks every served API has a handler here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordinator.server.handlers import (
    api_versions,
    delete_groups,
    describe_groups,
    find_coordinator,
    heartbeat,
    join_group,
    leave_group,
    list_groups,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    sync_group,
)

Handler = Callable[..., Any]

HANDLERS: dict[int, Handler] = {
    int(module.API_KEY): module.handle
    for module in (
        api_versions,
        metadata,
        find_coordinator,
        join_group,
        sync_group,
        heartbeat,
        leave_group,
        offset_commit,
        offset_fetch,
        describe_groups,
        list_groups,
        delete_groups,
        offset_delete,
    )
}
