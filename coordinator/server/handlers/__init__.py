"""One module per Kafka API; each declares its API_KEY, the VERSIONS it serves (min, max) and a
`handle(ctx, header, body)` that returns the kio response payload, or a coroutine producing it ("no response now:
the group answers later"). SERVED_APIS, derived from them, is the one table of what this coordinator serves: the
ApiVersions answer, the connection's check before decoding, and (with the relay) the group APIs' ranges in the
advertised table (coordinator/relay/versions.py declares what the relay forwards).

Ranges follow Kafka 3.9 (reference §9) except OffsetCommit 2–9 and OffsetFetch 1–9 (Kafka 4.0's floor: the older
versions are ZooKeeper-only), and the KIP-848 APIs ConsumerGroupHeartbeat 0-1 and ConsumerGroupDescribe 0-1
(Kafka 4.1's), and the transactional ones AddOffsetsToTxn 0-4 and TxnOffsetCommit 0-5 (Kafka 4.1's)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any

from coordinator.server.handlers import (
    add_offsets_to_txn,
    api_versions,
    consumer_group_describe,
    consumer_group_heartbeat,
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
    txn_offset_commit,
)
from protocol.apis import ServedApi

Handler = Callable[..., Any]

_MODULES: tuple[ModuleType, ...] = (
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
    consumer_group_heartbeat,
    consumer_group_describe,
    add_offsets_to_txn,
    txn_offset_commit,
)

SERVED_APIS: dict[int, ServedApi] = {
    module.API_KEY: ServedApi(module.API_KEY, *module.VERSIONS) for module in sorted(_MODULES, key=lambda m: m.API_KEY)
}

HANDLERS: dict[int, Handler] = {int(module.API_KEY): module.handle for module in _MODULES}
# ApiVersions answers with the table above: given to it here, so it need not import this package back.
HANDLERS[int(api_versions.API_KEY)] = partial(
    api_versions.handle,
    served=tuple((int(api.key), (api.min_version, api.max_version)) for api in SERVED_APIS.values()))


def served_ranges() -> dict[int, tuple[int, int]]:
    """api key -> (min, max) of every API served here."""
    return {int(key): (api.min_version, api.max_version) for key, api in SERVED_APIS.items()}
